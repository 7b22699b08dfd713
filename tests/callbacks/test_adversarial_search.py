"""AdversarialSearchAudit in a real Trainer on an SST-2 slice: the logged distribution is the search's own."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pytorch_lightning.loggers import Logger
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.audits.adversarial import adversarial_attention_search
from lightning_xai.callbacks import AdversarialSearchAudit


class _MemoryLogger(Logger):
    """Keeps every ``log_metrics`` call (rank zero) in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.records = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.records.append((step, dict(metrics)))


def _oracle(model, dm, num_samples, batch_size, steps, seed=0):
    """The audit subset (as AuditCallback draws it) searched directly, batch by batch."""
    dataset = dm.dataset("val")
    indices = sorted(torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:num_samples].tolist())
    collate = dm.val_dataloader().collate_fn
    max_jsd, change, found = [], [], []
    model.eval()
    for start in range(0, len(indices), batch_size):
        batch = collate([dataset[i] for i in indices[start : start + batch_size]])
        result = adversarial_attention_search(model, batch, steps=steps, seed=seed)
        max_jsd.append(result.max_jsd)
        change.append(result.output_change)
        found.append(result.found)
    return indices, torch.cat(max_jsd).double().numpy(), torch.cat(change).double().numpy(), torch.cat(found).numpy()


def test_logged_distribution_equals_the_search_run_directly(kit, tmp_path):
    dm = kit.make_dm()
    model = kit.make_model(dm)
    reference = kit.make_model(dm)  # same seed: trained without the callback, to check it is non-invasive
    audit = AdversarialSearchAudit(steps=25, num_samples=12, batch_size=8, every_n_epochs=2)
    logger = _MemoryLogger()
    kit.make_trainer(tmp_path / "a", [audit], max_epochs=2, logger=logger).fit(model, dm)
    kit.make_trainer(tmp_path / "b", max_epochs=2).fit(reference, dm)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)

    assert [(r["epoch"], r["num_examples"]) for r in audit.history] == [(1, 12)]  # every 2nd epoch only
    indices, max_jsd, change, found = _oracle(model, dm, 12, 8, 25)
    assert [e.index for e in audit.latest.examples] == indices
    metrics = audit.history[-1]["metrics"]
    ok = ~np.isnan(max_jsd)
    assert ok.sum() >= 6  # the check below is about real numbers, not an empty set
    assert metrics["fraction_found"] == pytest.approx(ok.mean(), abs=1e-12)
    assert metrics["fraction_jsd_at_least_threshold"] == pytest.approx((max_jsd[ok] >= 0.3).sum() / 12, abs=1e-12)
    assert metrics["jsd/mean"] == pytest.approx(max_jsd[ok].mean(), rel=1e-12)
    for key, q in (("q10", 0.1), ("q25", 0.25), ("median", 0.5), ("q75", 0.75), ("q90", 0.9)):
        assert metrics[f"jsd/{key}"] == pytest.approx(np.quantile(max_jsd[ok], q), rel=1e-12)
    assert metrics["output_change/mean"] == pytest.approx(change[found].mean(), rel=1e-12)
    assert (change[found] <= 0.05).all()
    # per-example detail, and the same numbers in the logger
    first = audit.latest.examples[0]
    assert len(first.maps["adversarial_attention"]) == len(first.token_ids)
    assert abs(sum(first.maps["adversarial_attention"]) - 1.0) < 1e-5
    logged = {
        k: v
        for _, record in logger.records
        for k, v in record.items()
        if k.startswith("adversarial_search/")
        and not k.startswith(("adversarial_search/cost/", "adversarial_search/budget/"))
    }  # the audit's cost
    expected = {f"adversarial_search/{k}": v for k, v in metrics.items() if not math.isnan(v)}
    assert logged == pytest.approx(expected, rel=1e-12)


def test_validate_stage_and_bad_configuration(kit, tmp_path):
    dm = kit.make_dm()
    model = kit.make_model(dm)
    audit = AdversarialSearchAudit(steps=5, num_samples=6, every_n_epochs=0)
    trainer = kit.make_trainer(tmp_path, [audit])
    trainer.validate(model, dm)
    assert [(r["stage"], r["split"], r["num_examples"]) for r in audit.history] == [("validate", "val", 6)]
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    with pytest.raises(MisconfigurationException, match="steps"):
        AdversarialSearchAudit(steps=0)
    with pytest.raises(MisconfigurationException, match="unknown option"):
        AdversarialSearchAudit(search_options={"step": 3})
    with pytest.raises(MisconfigurationException, match="jsd_threshold"):
        AdversarialSearchAudit(jsd_threshold=0.8)
    assert AdversarialSearchAudit(steps=5).state_key != AdversarialSearchAudit(steps=6).state_key

"""AttentionAudit's impermissible share (Pruthi et al.'s pronoun data): the logged statistic against a hand
computation from ``lightning_xai.attribution.attribute``, the logged key names, and the errors."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AttentionAudit, ImpermissibleAttentionMonitor
from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.models import AttentionClassifier

METHODS = ("gradient", "leave_one_out")
SIZES = {"train": 96, "val": 24, "test": 24}


class PronounSlice(TextClassificationDataModule):
    """The bundled pronoun task (mask = he/she/her/his/him/himself/herself), cut to its first examples."""

    def __init__(self, **kwargs) -> None:
        super().__init__("pronoun", **kwargs)

    def examples(self, split):
        return super().examples(split)[: SIZES[split]]


def _setup(tmp_path, logger=False, audit_kwargs=None, extra_callbacks=()):
    dm = PronounSlice(batch_size=16, seed=0)
    dm.setup("fit")
    pl.seed_everything(0, verbose=False)
    model = AttentionClassifier(
        dm.vocab_size,
        dm.num_classes,
        embedding_dim=16,
        hidden_dim=8,
        embedding_std=0.3,
        attention="linear",
        vocab=dm.vocab.itos,
    )
    audit = AttentionAudit(
        methods=METHODS, metrics=("kendall_tau",), num_samples=20, batch_size=7, **(audit_kwargs or {})
    )
    trainer = pl.Trainer(
        max_epochs=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        callbacks=[audit, *extra_callbacks],
    )
    trainer.fit(model, dm)
    return dm, model, audit


def _hand_shares(model, dm, n):
    """Σ_{i∈I}|s_i| / Σ_i|s_i| over real tokens, one example at a time, in float64 numpy."""
    dataset = dm.dataset("val")
    indices = sorted(torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:n].tolist())
    batch = collate([dataset[i] for i in indices])
    model.eval()
    maps = {"attention": model(batch).attention.detach()}
    for method in METHODS:
        maps[method] = attribute(model, batch, method)
    shares = {}
    for name, scores in maps.items():
        per_example = []
        for b in range(len(indices)):
            real = batch["mask"][b].numpy()
            imp = batch["impermissible"][b].numpy()
            s = np.abs(scores[b].double().numpy())
            inside = sum(s[t] for t in range(len(s)) if real[t] and imp[t])
            total = sum(s[t] for t in range(len(s)) if real[t])
            per_example.append(inside / total)
        shares[name] = np.array(per_example)
    return indices, batch, shares


def test_impermissible_share_matches_a_hand_computation(tmp_path):
    monitor = ImpermissibleAttentionMonitor(num_samples=20, batch_size=7)
    dm, model, audit = _setup(tmp_path, extra_callbacks=[monitor])
    indices, batch, shares = _hand_shares(model, dm, 20)
    assert [e.index for e in audit.latest.examples] == indices
    # the statistic must be informative on this slice: some masked tokens, shares strictly between 0 and 1
    assert batch["impermissible"].any(-1).all()
    metrics = audit.history[-1]["metrics"]
    for name in ("attention", *METHODS):
        assert 0.0 < shares[name].mean() < 1.0
        assert metrics[f"impermissible_share/{name}/mean"] == pytest.approx(shares[name].mean(), rel=1e-5)
        assert metrics[f"impermissible_share/{name}/std"] == pytest.approx(shares[name].std(), rel=1e-4, abs=1e-7)
        per_example = [e.values[f"impermissible_share/{name}"] for e in audit.latest.examples]
        # float32 maps of batches padded to another width differ in the last bits (LOO on tiny changes most)
        np.testing.assert_allclose(per_example, shares[name], rtol=1e-4, atol=1e-6)
    # attention sums to 1 over real tokens, so its share is the monitor's impermissible mass
    assert metrics["impermissible_share/attention/mean"] == pytest.approx(
        monitor.history[-1]["metrics"]["mass/mean"], rel=1e-5
    )
    # the shares differ by method (a share computed from the wrong map would not)
    assert len({round(metrics[f"impermissible_share/{n}/mean"], 6) for n in ("attention", *METHODS)}) == 3


def test_impermissible_share_is_logged_under_the_callbacks_prefix(tmp_path):
    logger = CSVLogger(str(tmp_path), name="csv")
    _setup(tmp_path, logger=logger)
    with open(f"{logger.log_dir}/metrics.csv") as handle:
        columns = next(csv.reader(handle))
    for name in ("attention", *METHODS):
        assert f"attention_audit/impermissible_share/{name}/mean" in columns


def test_no_share_without_the_key_and_a_clear_error_for_a_bad_mask(tmp_path):
    _, _, audit = _setup(tmp_path, audit_kwargs={"impermissible_key": "no_such_key"})
    assert not any(k.startswith("impermissible_share") for k in audit.history[-1]["metrics"])
    assert any(k.startswith("kendall_tau") for k in audit.history[-1]["metrics"])

    dm = PronounSlice(batch_size=16, seed=0)
    dm.setup("fit")
    model = AttentionClassifier(dm.vocab_size, dm.num_classes, embedding_dim=16, hidden_dim=8, vocab=dm.vocab.itos)
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",))
    batch = collate([dm.dataset("val")[i] for i in range(4)])
    batch["impermissible"] = batch["impermissible"].float()
    with pytest.raises(MisconfigurationException, match="must be a bool tensor shaped like the token mask"):
        audit.audit_batch(model, batch, torch.Generator(), list(range(4)))
    with pytest.raises(MisconfigurationException, match="impermissible_key"):
        AttentionAudit(impermissible_key="")


def test_all_zero_map_gives_nan_and_no_masked_token_gives_zero():
    dm = PronounSlice(batch_size=16, seed=0)
    dm.setup("fit")
    model = AttentionClassifier(dm.vocab_size, dm.num_classes, embedding_dim=16, hidden_dim=8, vocab=dm.vocab.itos)
    batch = collate([dm.dataset("val")[i] for i in range(3)])
    batch["impermissible"][1] = False
    with torch.no_grad():  # zero the classifier: every gradient is exactly 0 -> undefined share
        model.classifier.weight.zero_()
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",))
    found, _ = audit.audit_batch(model.eval(), batch, torch.Generator(), [0, 1, 2])
    gradient = found.values["impermissible_share/gradient"]
    assert all(math.isnan(v) for v in gradient.tolist())
    attention = found.values["impermissible_share/attention"]
    assert attention[1].item() == 0.0 and 0.0 < attention[0].item() < 1.0

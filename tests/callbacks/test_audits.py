"""The audit callbacks in real Trainers on real SST-2 slices: values, cadence, stages, errors at setup."""

from __future__ import annotations

import math

import numpy as np
import pytest
import pytorch_lightning as pl
import scipy.stats
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.adapters.protocol import ExplainOutput
from lightning_xai.attribution import attribute
from lightning_xai.audits.erasure import decision_flip
from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit, ImpermissibleAttentionMonitor
from lightning_xai.data import collate
from lightning_xai.metrics.functional import AOPC_BINS, aopc, comprehensiveness, jensen_shannon, topk_overlap


def _subset_batch(dm, split, n, seed=0):
    dataset = dm.dataset(split)
    indices = sorted(torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:n].tolist())
    return indices, collate([dataset[i] for i in indices])


def test_attention_audit_matches_scipy_on_the_fixed_subset(kit, tmp_path):
    dm = kit.make_dm()
    model = kit.make_model(dm)
    audit = AttentionAudit(
        methods=("gradient", "leave_one_out"),
        metrics=("kendall_tau", "jsd", "topk_overlap"),
        num_samples=24,
        batch_size=10,
    )
    kit.make_trainer(tmp_path, [audit], max_epochs=2).fit(model, dm)

    assert [r["epoch"] for r in audit.history] == [0, 1]
    assert all(r["num_examples"] == 24 and r["split"] == "val" for r in audit.history)
    indices, batch = _subset_batch(dm, "val", 24)
    assert [e.index for e in audit.latest.examples] == indices  # the same fixed subset every time

    model.eval()
    maps = {
        "attention": model(batch).attention.detach(),
        "gradient": attribute(model, batch, "gradient"),
        "leave_one_out": attribute(model, batch, "leave_one_out"),
    }
    mask = batch["mask"]
    metrics = audit.history[-1]["metrics"]
    for first, second in audit.pairs:
        taus, ps = [], []
        for b in range(mask.shape[0]):
            tau, p = scipy.stats.kendalltau(maps[first][b][mask[b]].numpy(), maps[second][b][mask[b]].numpy())
            taus.append(tau)
            ps.append(p)
        taus, ps = np.array(taus), np.array(ps)
        ok = ~np.isnan(taus)
        key = f"kendall_tau/{first}_vs_{second}"
        assert metrics[f"{key}/mean"] == pytest.approx(taus[ok].mean(), abs=1e-9)
        assert metrics[f"{key}/std"] == pytest.approx(taus[ok].std(), abs=1e-9)
        assert metrics[f"{key}/significant_fraction"] == pytest.approx((ps[ok] <= 0.05).mean(), abs=1e-12)
        jsd = jensen_shannon(maps[first], maps[second], mask).numpy()
        # float32 maps of batches padded to another width differ in the last bits; ranks (τ above) do not
        assert metrics[f"jsd/{first}_vs_{second}/mean"] == pytest.approx(np.nanmean(jsd), rel=1e-5)
        overlap = topk_overlap(maps[first], maps[second], mask).numpy()
        assert metrics[f"topk_overlap/{first}_vs_{second}/mean"] == pytest.approx(overlap.mean(), abs=1e-9)
    # per-example detail for the reports: maps over real tokens only
    first = audit.latest.examples[0]
    assert len(first.maps["attention"]) == len(first.token_ids) == int(mask[0].sum())
    assert abs(sum(first.maps["attention"]) - 1.0) < 1e-5


def test_erasure_and_baselines_and_monitor_values(kit, tmp_path):
    dm = kit.make_dm(impermissible=True)
    model = kit.make_model(dm)
    erasure = ErasureAudit(rankings=("attention", "random"), num_samples=16)
    with_aopc = ErasureAudit(
        rankings=("attention",), aopc_bins=AOPC_BINS, decision_flip=False, num_samples=16, log_prefix="erasure_aopc"
    )
    baselines = AttentionBaselines(num_samples=16, num_permutations=12)
    monitor = ImpermissibleAttentionMonitor(num_samples=16)
    kit.make_trainer(tmp_path, [erasure, with_aopc, baselines, monitor]).fit(model, dm)
    model.eval()
    _, batch = _subset_batch(dm, "val", 16)
    flips = decision_flip(model, batch, "attention")
    m = erasure.history[-1]["metrics"]
    assert m["attention/flipped/mean"] == pytest.approx(flips.flipped.double().mean().item())
    # ERASER at k by default; AOPC over the bins only when asked, and then ERASER's AOPC
    with torch.no_grad():
        attention = model(batch).attention
    at_k, (aopc_comp, aopc_suff) = comprehensiveness(model, batch, attention, k=0.2), aopc(model, batch, attention)
    assert m["attention/comprehensiveness/mean"] == pytest.approx(at_k.double().mean().item(), abs=1e-6)
    assert not any("aopc" in key for key in m)
    a = with_aopc.history[-1]["metrics"]
    assert a["attention/aopc_comprehensiveness/mean"] == pytest.approx(aopc_comp.double().mean().item(), abs=1e-6)
    assert a["attention/aopc_sufficiency/mean"] == pytest.approx(aopc_suff.double().mean().item(), abs=1e-6)
    frac = flips.fraction_removed[flips.flipped].double()
    if frac.numel():
        assert m["attention/fraction_removed/mean"] == pytest.approx(frac.mean().item())
    assert 0.0 <= m["random/flipped/mean"] <= 1.0
    b = baselines.history[-1]["metrics"]
    assert b["permutation/median_delta"] >= 0 and 0 <= b["uniform/flip_fraction"] <= 1
    assert sum(v for k, v in b.items() if k.endswith("/count")) == 16
    with torch.no_grad():
        attention = model(batch).attention
    mass = (attention * batch["impermissible"]).sum(-1).double()
    assert monitor.history[-1]["metrics"]["mass/mean"] == pytest.approx(mass.mean().item(), abs=1e-6)
    assert batch["impermissible"].any()


def test_every_n_train_steps_cadence(kit, tmp_path):
    dm = kit.make_dm()  # 192 train examples / 16 = 12 steps per epoch
    audit = AttentionAudit(
        methods=("gradient",), metrics=("kendall_tau",), every_n_epochs=0, every_n_train_steps=5, num_samples=8
    )
    kit.make_trainer(tmp_path, [audit], max_epochs=2).fit(kit.make_model(dm), dm)
    assert [r["global_step"] for r in audit.history] == [5, 10, 15, 20]


def test_validate_and_test_run_under_inference_mode(kit, tmp_path):
    dm = kit.make_dm()
    model = kit.make_model(dm)
    audit = AttentionAudit(
        methods=("gradient", "integrated_gradients", "leave_one_out"),
        num_samples=12,
        method_options=kit.FAST_METHODS,
        every_n_epochs=0,
    )
    baselines = AttentionBaselines(num_samples=12, num_permutations=5, every_n_epochs=0)
    trainer = kit.make_trainer(tmp_path, [audit, baselines])
    trainer.validate(model, dm)
    trainer.test(model, dm)
    assert [(r["stage"], r["split"]) for r in audit.history] == [("validate", "val"), ("test", "test")]
    for record in audit.history + baselines.history:
        assert record["metrics"] and all(math.isfinite(v) for k, v in record["metrics"].items() if "bin[" not in k)
    assert all(p.grad is None for p in model.parameters())


class _NoProtocol(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_model_without_the_protocol_fails_at_setup(kit, tmp_path):
    model = _NoProtocol()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    trainer = kit.make_trainer(tmp_path, [AttentionAudit()])
    with pytest.raises(MisconfigurationException, match="ExplainableModel protocol.*missing: embed"):
        trainer.fit(model, loader)
    assert model.steps == 0


class _NoAttention(pl.LightningModule):
    """Implements the protocol but its forward returns no attention."""

    def __init__(self, vocab_size):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, 4)
        self.out = torch.nn.Linear(4, 2)
        self.steps = 0

    def embed(self, batch):
        return self.embedding(batch["input_ids"])

    def token_mask(self, batch):
        return batch["mask"]

    def forward_from_embeddings(self, embeddings, batch, *, attention_override=None):
        return ExplainOutput(logits=self.out(embeddings.mean(1)), attention=None)

    def training_step(self, batch, batch_idx):
        self.steps += 1
        logits = self.forward_from_embeddings(self.embed(batch), batch).logits
        return torch.nn.functional.cross_entropy(logits, batch["labels"])

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_model_without_attention_fails_before_training(kit, tmp_path):
    dm = kit.make_dm()
    model = _NoAttention(dm.vocab_size)
    with pytest.raises(MisconfigurationException, match="needs the model's attention"):
        kit.make_trainer(tmp_path, [AttentionAudit(num_samples=4)]).fit(model, dm)
    assert model.steps == 0


def test_impermissible_monitor_without_the_key_fails_before_training(kit, tmp_path):
    dm = kit.make_dm(impermissible=False)
    model = kit.make_model(dm)
    with pytest.raises(MisconfigurationException, match="no 'impermissible' key"):
        kit.make_trainer(tmp_path, [ImpermissibleAttentionMonitor(num_samples=4)]).fit(model, dm)
    assert model.global_step == 0


def test_plain_dataloaders_and_tokens_from_the_model_vocab(kit, tmp_path):
    from lightning_xai.reporting import AuditReport

    dm = kit.make_dm()
    model = kit.make_model(dm)
    train = torch.utils.data.DataLoader(dm.dataset("train"), batch_size=16, collate_fn=collate)
    val = torch.utils.data.DataLoader(dm.dataset("val"), batch_size=16, collate_fn=collate)
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=6)
    kit.make_trainer(tmp_path, [audit, AuditReport(png=False)]).fit(model, train, val)
    example = audit.latest.examples[0]
    assert example.tokens == [dm.vocab.itos[i] for i in example.token_ids]  # no data module: the model's vocab
    assert len(example.tokens) == len(dm.tokens("val", example.index))


def test_epoch_audits_run_without_a_validation_loop(kit, tmp_path):
    dm = kit.make_dm()
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=4, every_n_epochs=2)
    kit.make_trainer(tmp_path, [audit], max_epochs=4, limit_val_batches=0).fit(kit.make_model(dm), dm)
    assert [r["epoch"] for r in audit.history] == [1, 3]

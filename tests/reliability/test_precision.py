"""Reduced precision never changes an audit's numbers silently (issue 14, "bf16/fp16").

Under bfloat16 autocast leave-one-out moved from its float32 map (per-sentence τ of median 0.66) and
``AttentionAudit()`` under ``Trainer(precision="bf16-mixed")`` logged other agreements than under
``precision="32"``, without a word. Now the audits compute the precision-sensitive maps (leave-one-out,
erasure, IG) in float32 by default (``precision="auto"``), say so once, and keep the trainer's precision on
request (``precision="trainer"``); weights cast to float32 for an audit are put back bit for bit. IG's
convergence warning no longer divides by a gap of ~0.

Real Trainers on CPU, the bundled SST-2 (the first examples of each split), a tiny reference model.
"""

from __future__ import annotations

import re
import warnings

import pytest
import pytorch_lightning as pl
import torch

from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AttentionAudit, ErasureAudit
from lightning_xai.data import TextClassificationDataModule
from lightning_xai.models import AttentionClassifier

N = 24


class _SST2Head(TextClassificationDataModule):
    def examples(self, split):
        return super().examples(split)[: 96 if split == "train" else N]


@pytest.fixture(scope="module")
def dm():
    data = _SST2Head("sst2", batch_size=N, seed=0)
    data.setup("fit")
    return data


@pytest.fixture(scope="module")
def trained(dm):
    """A tiny reference model after a few float32 steps (weights that give non-uniform maps)."""
    pl.seed_everything(0, verbose=False)
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3)
    pl.Trainer(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    ).fit(model, dm)
    return model.state_dict()


def _validate(dm, state, precision, tmp_path, *, audit_precision=None, bf16_weights=False, callback=None):
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3)
    model.load_state_dict(state)
    if bf16_weights:
        model = model.bfloat16()
    options = {} if audit_precision is None else {"precision": audit_precision}
    audit = callback or AttentionAudit(
        methods=("gradient", "leave_one_out"), metrics=("kendall_tau",), num_samples=N, num_report_examples=N, **options
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.Trainer(
            precision=precision,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
            callbacks=[audit],
        ).validate(model, dm, verbose=False)
    said = [str(w.message) for w in caught if "reduced precision" in str(w.message)]
    return audit, model, said


def _maps(audit, method):
    return [torch.tensor(e.maps[method], dtype=torch.float64) for e in audit.latest.examples]


def test_bf16_mixed_audits_leave_one_out_in_float32_and_says_so(dm, trained, tmp_path):
    full, _, quiet = _validate(dm, trained, "32", tmp_path)
    auto, _, said = _validate(dm, trained, "bf16-mixed", tmp_path)
    kept, _, _ = _validate(dm, trained, "bf16-mixed", tmp_path, audit_precision="trainer")
    assert quiet == []
    assert len(said) == 1 and "AttentionAudit" in said[0] and "precision='trainer'" in said[0]
    assert "leave_one_out" in said[0] and "bf16-mixed" in said[0]
    for ours, reference in zip(_maps(auto, "leave_one_out"), _maps(full, "leave_one_out")):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    key = "kendall_tau/attention_vs_leave_one_out/mean"
    assert auto.history[-1]["metrics"][key] == pytest.approx(full.history[-1]["metrics"][key], abs=0.02)
    # the option keeps the trainer's precision: bf16 leave-one-out is another map
    worst = max(float((a - b).abs().max()) for a, b in zip(_maps(kept, "leave_one_out"), _maps(full, "leave_one_out")))
    assert worst > 1e-4


def test_erasure_audit_runs_in_float32_under_autocast(dm, trained, tmp_path):
    def erasure():
        return ErasureAudit(rankings=("attention", "leave_one_out"), num_samples=N, num_report_examples=N)

    full, _, _ = _validate(dm, trained, "32", tmp_path, callback=erasure())
    auto, _, said = _validate(dm, trained, "bf16-mixed", tmp_path, callback=erasure())
    assert len(said) == 1 and "ErasureAudit" in said[0]
    for ours, reference in zip(_maps(auto, "leave_one_out"), _maps(full, "leave_one_out")):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    for key, value in full.history[-1]["metrics"].items():
        if "comprehensiveness" in key or "sufficiency" in key:
            assert auto.history[-1]["metrics"][key] == pytest.approx(value, abs=1e-5), key


def test_bf16_weights_are_audited_in_float32_and_put_back_bit_for_bit(dm, trained, tmp_path):
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3)
    model.load_state_dict(trained)
    before = {k: v.clone() for k, v in model.bfloat16().state_dict().items()}
    audit, audited, said = _validate(dm, before, "32", tmp_path, bf16_weights=True)
    assert len(said) == 1 and "torch.bfloat16 weights" in said[0]
    after = audited.state_dict()
    assert all(after[k].dtype == torch.bfloat16 and torch.equal(after[k], v) for k, v in before.items())
    # the audit's maps are those of the float32 copy of the bf16 weights
    reference, _, _ = _validate(dm, {k: v.float() for k, v in before.items()}, "32", tmp_path)
    for ours, theirs in zip(_maps(audit, "leave_one_out"), _maps(reference, "leave_one_out")):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    kept, kept_model, quiet = _validate(dm, before, "32", tmp_path, audit_precision="trainer", bf16_weights=True)
    assert quiet == [] and next(kept_model.parameters()).dtype == torch.bfloat16


def test_float32_training_is_not_warned_about(dm, trained, tmp_path):
    _, _, said = _validate(dm, trained, "32", tmp_path, audit_precision="32")
    assert said == []


def test_ig_warning_reports_absolute_and_relative_error():
    from lightning_xai.attribution.integrated_gradients import _worst_delta

    delta = torch.tensor([0.02, 0.5, 1e-9])
    gap = torch.tensor([0.1, 0.0, 0.0])
    bad = torch.tensor([True, True, False])
    text = _worst_delta(delta, gap, bad, floor=1e-4)
    assert text.startswith("worst |delta| = 0.5") and "no relative error" in text and "%" not in text
    text = _worst_delta(delta, gap, torch.tensor([True, False, False]), floor=1e-4)
    assert "worst |delta| = 0.02" in text and "20.0% of |F(x) - F(x')| = 0.1" in text


def test_ig_warning_under_bf16_autocast_is_readable(dm, trained):
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3).eval()
    model.load_state_dict(trained)
    batch = next(iter(dm.val_dataloader()))
    with warnings.catch_warnings(record=True) as caught, torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("always")
        attribute(model, batch, "integrated_gradients", None, n_steps=4)
    texts = [str(w.message) for w in caught if "convergence delta" in str(w.message)]
    assert texts, "4-step IG in bf16 should miss the completeness tolerance"
    percents = [float(p) for p in re.findall(r"([0-9.]+)% of \|F", texts[0])]
    assert all(p < 1e4 for p in percents)
    assert "worst |delta| = " in texts[0] and "compute it in float32" in texts[0]


def test_no_word_when_no_map_is_switched(dm, trained, tmp_path):
    """An audit of gradients only computes nothing in float32 under autocast, so it says nothing."""
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=N)
    _, _, said = _validate(dm, trained, "bf16-mixed", tmp_path, callback=audit)
    assert said == []

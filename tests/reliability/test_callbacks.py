"""Issue 14, callbacks: non-finite logits are undefined (not 'not flipped', not wrong), a metric undefined for a whole
audit is logged as NaN with a warning, a misspelled method fails at construction, iterable val datasets work."""

from __future__ import annotations

import importlib.util
import math
import warnings
from pathlib import Path

import pytest
import torch
from pytorch_lightning.loggers import Logger
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, IterableDataset

from lightning_xai.callbacks import (
    AdversarialSearchAudit,
    AttentionAudit,
    AttentionBaselines,
    ErasureAudit,
    ImpermissibleAttentionMonitor,
)
from lightning_xai.callbacks._audit.rows import row_reader
from lightning_xai.callbacks._audit.subset import draw_subset
from lightning_xai.data import collate

_SPEC = importlib.util.spec_from_file_location("callbacks_kit", Path(__file__).parents[1] / "callbacks" / "conftest.py")
kit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kit)  # tests/callbacks' SST-2 slices and tiny models (importlib mode: no conftest import)


class _MemoryLogger(Logger):
    """Every ``log_metrics`` call, in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.logged = {}

    name = property(lambda self: "memory")
    version = property(lambda self: 0)

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.update(metrics)


def _audits(num_samples=16):
    options = dict(num_samples=num_samples, batch_size=8, every_n_epochs=None)
    return [
        ErasureAudit(rankings=("attention",), eraser=False, **options),
        AttentionBaselines(num_permutations=4, **options),
        ImpermissibleAttentionMonitor(**options),
        AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), **options),
    ]


def _validate(tmp_path, model, dm, audits):
    logger = _MemoryLogger()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kit.make_trainer(tmp_path, audits, logger=logger).validate(model, dm, verbose=False)
    return logger.logged, [str(w.message) for w in caught]


def test_nan_logits_are_undefined_and_logged_as_nan_with_a_warning(tmp_path):
    dm = kit.make_dm(impermissible=True)
    model = kit.make_model(dm)
    with torch.no_grad():
        model.classifier.weight.fill_(math.nan)  # the repro of issue 14: a model whose logits are NaN
    audits = _audits() + [AdversarialSearchAudit(steps=5, num_samples=16, batch_size=8, every_n_epochs=None)]
    logged, messages = _validate(tmp_path, model, dm, audits)
    erasure, baselines, monitor, agreement, search = (a.history[-1]["metrics"] for a in audits)
    # before: flipped/mean 0.0, flip_fraction 0.0, accuracy 0.4375 (argmax of NaN), τ dropped from the logs
    assert math.isnan(erasure["attention/flipped/mean"])
    assert math.isnan(baselines["uniform/flip_fraction"]) and math.isnan(baselines["permutation/median_delta"])
    assert math.isnan(monitor["accuracy"]) and math.isnan(monitor["mass/mean"])
    assert math.isnan(agreement["kendall_tau/attention_vs_gradient/mean"])
    assert math.isnan(search["fraction_found"]) and search["count"] == 0  # was 0.0: "no adversary found"
    for key in (
        "validate/erasure_audit/attention/flipped/mean",
        "validate/attention_baselines/uniform/flip_fraction",
        "validate/impermissible_attention/accuracy",
        "validate/attention_audit/kendall_tau/attention_vs_gradient/mean",
    ):
        assert math.isnan(logged[key]), key  # logged as NaN, not dropped
    for audit in audits:
        name = type(audit).__name__
        assert all(e.undefined == "non-finite logits" for e in audit.latest.examples)
        assert any(
            m.startswith(f"{name}: 16 of 16 audited 'val' examples have undefined results (non-finite logits")
            for m in messages
        ), name
        assert any(m.startswith(name) and "undefined for the whole 'val' audit" in m for m in messages), name


def test_rows_with_nan_logits_are_left_out_and_the_others_keep_their_numbers(tmp_path):
    dm = kit.make_dm(impermissible=True)
    model = kit.make_model(dm)
    healthy = _audits()
    _validate(tmp_path / "healthy", model, dm, healthy)
    word = dm.vocab.stoi["the"]  # a word in some audited sentences, not all: their rows' logits become NaN
    with torch.no_grad():
        model.embedding.weight[word] = math.nan
    poisoned = _audits()
    _, messages = _validate(tmp_path / "poisoned", model, dm, poisoned)
    examples = poisoned[0].latest.examples
    bad = [e.undefined is not None for e in examples]
    assert bad == [word in e.token_ids for e in examples] and 0 < sum(bad) < len(bad)
    assert any(f"ErasureAudit: {sum(bad)} of 16 audited 'val' examples have undefined" in m for m in messages)
    for before, after in zip(healthy, poisoned):
        kept = [(b, a) for b, a, flag in zip(before.latest.examples, after.latest.examples, bad) if not flag]
        for b, a in kept:  # the clean rows are audited exactly as before
            assert a.undefined is None and a.prediction == b.prediction
            assert a.values == pytest.approx(b.values, nan_ok=True, rel=1e-5, abs=1e-6)
        for e, flag in zip(after.latest.examples, bad):
            if flag:
                assert all(math.isnan(v) for v in e.values.values())
    erasure = poisoned[0].history[-1]["metrics"]["attention/flipped/mean"]
    clean = [b.values["attention/flipped"] for b, flag in zip(healthy[0].latest.examples, bad) if not flag]
    assert erasure == pytest.approx(sum(clean) / len(clean))  # undefined rows are not counted as 'not flipped'
    monitor = poisoned[2].history[-1]["metrics"]["accuracy"]
    right = [b.prediction == b.label for b, flag in zip(healthy[2].latest.examples, bad) if not flag]
    assert monitor == pytest.approx(sum(right) / len(right))


def test_a_healthy_model_warns_about_no_undefined_example(tmp_path):
    dm = kit.make_dm(impermissible=True)
    audits = _audits()
    logged, messages = _validate(tmp_path, kit.make_model(dm), dm, audits)
    assert not any("have undefined results" in m for m in messages)
    assert all(e.undefined is None for a in audits for e in a.latest.examples)
    assert math.isfinite(logged["validate/erasure_audit/attention/flipped/mean"])


def test_a_misspelled_method_fails_at_construction_naming_the_close_match():
    with pytest.raises(MisconfigurationException, match=r"unknown method 'gradiant'; did you mean 'gradient'"):
        AttentionAudit(methods=("gradiant",), every_n_epochs=3)
    with pytest.raises(MisconfigurationException, match=r"unknown ranking 'atention'; did you mean 'attention'"):
        ErasureAudit(rankings=("atention",))
    # happy path: built-in names and methods registered by the attribution plugins
    assert AttentionAudit(methods=("gradient", "smooth_attention", "attention_flow")).methods[1] == "smooth_attention"
    assert ErasureAudit(rankings=("attention", "lrp")).rankings == ["attention", "lrp"]


class _Stream(IterableDataset):
    """A split as an ``IterableDataset`` (the same order every pass), with or without ``__len__``."""

    def __init__(self, rows, sized=True):
        self.rows, self.sized = rows, sized

    def __iter__(self):
        return (self.rows[i] for i in range(len(self.rows)))

    def __len__(self):
        if not self.sized:
            raise TypeError("a stream has no length")
        return len(self.rows)


class _StreamedVal(kit.SST2Slice):
    sized = True

    def val_dataloader(self):
        return DataLoader(_Stream(self.dataset("val"), self.sized), batch_size=16, collate_fn=collate)


def _streamed_dm(sized):
    dm = _StreamedVal({"train": 192, "val": 48, "test": 48}, batch_size=16, seed=0)  # make_dm's vocabulary
    dm.sized = sized
    dm.setup("fit")
    return dm


def test_an_iterable_val_dataset_is_audited_like_the_map_style_one(tmp_path):
    model = kit.make_model(kit.make_dm())
    mapped = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=12, every_n_epochs=None)
    streamed = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=12, every_n_epochs=None)
    kit.make_trainer(tmp_path / "map", [mapped]).validate(model, kit.make_dm(), verbose=False)
    kit.make_trainer(tmp_path / "stream", [streamed]).validate(model, _streamed_dm(True), verbose=False)
    assert [e.index for e in streamed.latest.examples] == [e.index for e in mapped.latest.examples]
    assert streamed.history[-1]["metrics"] == mapped.history[-1]["metrics"]


def test_an_unsized_stream_audits_its_first_examples_or_asks_for_num_samples(tmp_path):
    model = kit.make_model(kit.make_dm())
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=8, every_n_epochs=None)
    kit.make_trainer(tmp_path / "a", [audit]).validate(model, _streamed_dm(False), verbose=False)
    assert [e.index for e in audit.latest.examples] == list(range(8))
    with pytest.raises(MisconfigurationException, match="IterableDataset without __len__.*set num_samples=N"):
        draw_subset(_Stream(list(range(5)), sized=False), None, seed=0, owner="AttentionAudit")
    with pytest.raises(MisconfigurationException, match="ended after 5 of the 8 audited examples"):
        row_reader(_Stream(list(range(5)), sized=False), draw_subset(_Stream([], sized=False), 8, seed=0))

"""The cost budget: the pure plan (properties) and a real Trainer whose audit is deliberately slow."""

from __future__ import annotations

import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.attribution import ATTRIBUTION_METHODS, register_method
from lightning_xai.callbacks import AttentionAudit
from lightning_xai.callbacks._audit.budget import Plan, limited_size, plan
from tests.callbacks.conftest import make_dm, make_model, make_trainer

positive = st.floats(min_value=1e-4, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    spe=positive,
    train=positive,
    budget=st.floats(min_value=1e-3, max_value=2.0),
    requested=st.integers(1, 5000),
    fixed_samples=st.booleans(),
    fixed_cadence=st.booleans(),
)
def test_plan_lowers_the_cadence_first_and_never_goes_below_the_floor(
    spe, train, budget, requested, fixed_samples, fixed_cadence
):
    chosen = plan(spe, train, budget, requested, fixed_samples=fixed_samples, fixed_cadence=fixed_cadence)
    assert 1 <= chosen.cadence <= (1 if fixed_cadence else 10)
    assert min(128, requested) <= chosen.num_samples <= requested
    if fixed_samples:
        assert chosen.num_samples == requested
    assert math.isclose(chosen.share, chosen.num_samples * spe / (chosen.cadence * train), rel_tol=1e-9)
    assert chosen.fits == (chosen.share <= budget)
    if chosen.num_samples < requested:  # the subset shrinks only at the largest cadence, and then fills the budget
        assert chosen.cadence == (1 if fixed_cadence else 10)
        assert chosen.num_samples == 128 or (chosen.num_samples + 1) * spe / (chosen.cadence * train) > budget
    if chosen.cadence > 1 and chosen.num_samples == requested:  # the smallest cadence that fits
        assert requested * spe / ((chosen.cadence - 1) * train) > budget * (1 - 1e-9)
    if requested * spe / train <= budget:
        assert chosen == Plan(requested, 1, requested * spe / train, True)


def test_plan_examples_and_refusals():
    assert plan(0.05, 100.0, 0.05, 256).cadence == 3
    assert plan(1.0, 100.0, 0.05, 256).num_samples == 128
    assert plan(1.0, 100.0, 0.05, 256, min_samples=16).num_samples == 50
    assert plan(1.0, 100.0, 0.05, 64).num_samples == 64  # a subset below the floor is not shrunk further
    with pytest.raises(ValueError):
        plan(0.0, 1.0, 0.05, 256)
    with pytest.raises(ValueError):
        plan(1.0, float("nan"), 0.05, 256)
    assert limited_size(256, 2, 16, 872) == 32 and limited_size(256, 0.5, 16, 872) == 128
    assert limited_size(256, 0, 16, 872) == 256 and limited_size(None, 0.5, 16, 872) == 436


def test_budget_is_checked_at_init():
    for bad in (0, -0.1, True, "5%", float("inf")):
        with pytest.raises(MisconfigurationException, match="budget"):
            AttentionAudit(budget=bad)
    assert AttentionAudit().budget == 0.05 and AttentionAudit(budget=None).budget is None


@pytest.fixture
def slow_method():
    """A registered method that sleeps ``factor`` × the training time so far, spread over the audited rows."""
    state = {"per_row": None, "factor": 1.5, "start": None}

    @register_method("sleepy")
    def sleepy(model, batch, target, *, create_graph=False):
        mask = model.token_mask(batch)
        if state["per_row"] is None:
            state["per_row"] = state["factor"] * (time.perf_counter() - state["start"]) / 256
        time.sleep(state["per_row"] * mask.shape[0])
        return torch.rand(mask.shape, generator=torch.Generator().manual_seed(0))

    yield state
    del ATTRIBUTION_METHODS["sleepy"]


class _Subsets(AttentionAudit):
    """Records the audited dataset indices of every fit audit."""

    def run_audit(self, trainer, pl_module, stage, split):
        result = super().run_audit(trainer, pl_module, stage, split)
        self.seen = getattr(self, "seen", []) + [(trainer.current_epoch, sorted(e.index for e in result.examples))]
        return result


def _fit(tmp_path, audit, state, epochs):
    import pytorch_lightning as pl

    class Clock(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            state["start"] = time.perf_counter()

    audit.budget_min_seconds = 0.0  # the sleeps are short; real audits under 5 s are never thinned
    dm = make_dm(val=300, train=96)
    trainer = make_trainer(tmp_path, [Clock(), audit], max_epochs=epochs)
    trainer.fit(make_model(dm), dm)
    return trainer


def test_slow_audit_lowers_its_cadence_and_keeps_its_subset(tmp_path, slow_method):
    """An audit costing ~1.5x the training time under budget=1.0 audits every 2nd (or 3rd) epoch on 256 examples."""
    audit = _Subsets(methods=("sleepy",), metrics=("kendall_tau",), budget=1.0, on_validate=False, on_test=False)
    trainer = _fit(tmp_path, audit, slow_method, epochs=7)
    every = int(trainer.callback_metrics["attention_audit/budget/every_n_epochs"])
    assert 2 <= every <= 4, every
    assert int(trainer.callback_metrics["attention_audit/budget/num_samples"]) == 256
    assert float(trainer.callback_metrics["attention_audit/budget/share"]) > 1.0
    epochs = [epoch for epoch, _ in audit.seen]
    assert epochs == [0] + [e for e in range(1, 7) if e % every == 0]
    assert len({tuple(indices) for _, indices in audit.seen}) == 1 and len(audit.seen[0][1]) == 256
    assert audit.plan.cadence == every and audit.state_dict()["budget"]["plan"]["cadence"] == every


def test_over_budget_at_the_largest_cadence_shrinks_to_128_nested(tmp_path, slow_method):
    audit = _Subsets(methods=("sleepy",), metrics=("kendall_tau",), budget=1e-4, on_validate=False, on_test=False)
    trainer = _fit(tmp_path, audit, slow_method, epochs=1)
    assert (audit.plan.cadence, audit.plan.num_samples, audit.plan.fits) == (10, 128, False)
    assert int(trainer.callback_metrics["attention_audit/budget/every_n_epochs"]) == 10
    kept = audit.audit_indices(trainer, "val")
    assert len(kept) == 128 and set(kept) <= set(audit.seen[0][1])


def test_explicit_choices_win_and_none_switches_off(tmp_path, slow_method):
    audit = _Subsets(
        methods=("sleepy",),
        metrics=("kendall_tau",),
        num_samples=256,
        every_n_epochs=1,
        budget=1e-4,
        on_validate=False,
        on_test=False,
    )
    trainer = _fit(tmp_path, audit, slow_method, epochs=2)
    assert [e for e, _ in audit.seen] == [0, 1] and audit.plan.cadence == 1 and audit.plan.num_samples == 256
    assert "attention_audit/budget/share" in trainer.callback_metrics
    off = _Subsets(methods=("sleepy",), metrics=("kendall_tau",), budget=None, on_validate=False, on_test=False)
    trainer = _fit(tmp_path, off, slow_method, epochs=2)
    assert [e for e, _ in off.seen] == [0, 1] and off.plan is None
    assert not any("budget" in k for k in trainer.callback_metrics)


def test_limit_val_batches_caps_the_subset(tmp_path, slow_method):
    slow_method["factor"] = 0.0
    audit = _Subsets(methods=("sleepy",), metrics=("kendall_tau",), on_validate=False, on_test=False)
    dm = make_dm(val=300, train=96)
    trainer = make_trainer(tmp_path, [audit], max_epochs=1, limit_val_batches=2)
    slow_method["start"] = time.perf_counter()
    trainer.fit(make_model(dm), dm)
    assert len(audit.seen[0][1]) == 2 * 16  # two val batches of 16


def test_an_audit_under_five_seconds_is_never_thinned(tmp_path, slow_method):
    slow_method["factor"] = 0.0
    audit = _Subsets(methods=("sleepy",), metrics=("kendall_tau",), budget=1e-6, on_validate=False, on_test=False)
    dm = make_dm(val=300, train=96)
    slow_method["start"] = time.perf_counter()
    trainer = make_trainer(tmp_path, [audit], max_epochs=2)
    trainer.fit(make_model(dm), dm)
    assert [e for e, _ in audit.seen] == [0, 1] and (audit.plan.cadence, audit.plan.num_samples) == (1, 256)
    assert int(trainer.callback_metrics["attention_audit/budget/every_n_epochs"]) == 1

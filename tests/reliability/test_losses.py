"""Issue 14, losses: every weight checked, the deception penalty keeps its gradient near mass 1, and NaN attention
never becomes a NaN loss or NaN weights without a word."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Subset

from lightning_xai.adapters import ExplainOutput
from lightning_xai.data import collate
from lightning_xai.losses import (
    AttentionAlignmentLoss,
    ConicityLoss,
    DeceptionPenalty,
    ErasureFaithfulnessLoss,
    ModelConsistentAdversary,
    RationaleSupervisionLoss,
    WordTyingLoss,
    attention_alignment_kl,
    conicity,
    deception_penalty,
    model_consistent_adversary_loss,
    rationale_supervision,
)
from lightning_xai.models import AttentionClassifier

_SPEC = importlib.util.spec_from_file_location("callbacks_kit", Path(__file__).parents[1] / "callbacks" / "conftest.py")
kit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kit)  # tests/callbacks' SST-2 slices and tiny models (importlib mode: no conftest import)

NAN, INF = float("nan"), float("inf")


def _reference_model(seed=0):
    torch.manual_seed(seed)
    return AttentionClassifier(50, 2, embedding_dim=16, hidden_dim=8).eval()


_BATCH = {
    "input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]]),
    "mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool(),
    "impermissible": torch.tensor([[True, False, False, False], [False, True, False, False]]),
    "rationale": torch.tensor([[False, True, True, False], [True, False, False, False]]),
}

_LOSSES = {
    "DeceptionPenalty": lambda w: DeceptionPenalty(weight=w),
    "ErasureFaithfulnessLoss": lambda w: ErasureFaithfulnessLoss(weight=w),
    "AttentionAlignmentLoss": lambda w: AttentionAlignmentLoss("gradient", weight=w),
    "ConicityLoss": lambda w: ConicityLoss(weight=w),
    "RationaleSupervisionLoss": lambda w: RationaleSupervisionLoss(weight=w),
    "WordTyingLoss": lambda w: WordTyingLoss(16, 16, weight=w),
    "ModelConsistentAdversary": lambda w: ModelConsistentAdversary(_reference_model(seed=1), weight=w),
}


@pytest.mark.parametrize("weight", [NAN, INF, -1.0])
@pytest.mark.parametrize("name", sorted(_LOSSES))
def test_every_loss_rejects_a_weight_that_is_not_finite_and_nonnegative(name, weight):
    with pytest.raises(ValueError, match=rf"{name}: weight must be >= 0 and finite, got {weight}"):
        _LOSSES[name](weight)
    assert _LOSSES[name](0.5).weight == 0.5  # happy path


def test_functional_weights_and_the_other_erasure_weights_are_checked_too():
    with pytest.raises(ValueError, match="must be >= 0 and finite"):
        deception_penalty(torch.tensor([0.5]), weight=NAN)
    with pytest.raises(ValueError, match="must be >= 0 and finite"):
        model_consistent_adversary_loss(
            torch.zeros(1, 2), torch.full((1, 2), 0.5), torch.full((1, 2), 0.5), torch.full((1, 2), 0.5), weight=INF
        )
    with pytest.raises(ValueError, match="sufficiency_weight must be >= 0"):
        ErasureFaithfulnessLoss(sufficiency_weight=-0.5)


def _penalty_and_grad(scores):
    scores = scores.clone().requires_grad_(True)
    out = ExplainOutput(logits=torch.zeros(1, 2), attention=scores.softmax(-1))
    value = DeceptionPenalty(weight=1.0, eps=1e-6)(out, {"impermissible": torch.tensor([[True, False, False]])})
    value.backward()
    return value, scores.grad


def test_penalty_gradient_near_mass_one_is_the_exact_one():
    # mass 0.99999: d(-log(1 - m)) / d(score of the impermissible token) = m, the softmax's own gradient
    gap = math.log(2 * (1 - 1e-5) / 1e-5)
    value, grad = _penalty_and_grad(torch.tensor([[gap, 0.0, 0.0]], dtype=torch.float64))
    assert value.item() == pytest.approx(-math.log(1e-5), rel=1e-9)
    assert grad[0, 0].item() == pytest.approx(1 - 1e-5, rel=1e-6)
    assert grad.sum().item() == pytest.approx(0.0, abs=1e-9)


def test_penalty_gradient_stays_nonzero_where_the_old_clamp_zeroed_it():
    # permissible mass 1e-7 < eps: the value is capped at -log(eps), the gradient must still push the mass down
    gap = math.log(2 * (1 - 1e-7) / 1e-7)
    value, grad = _penalty_and_grad(torch.tensor([[gap, 0.0, 0.0]]))
    assert value.item() == pytest.approx(-math.log(1e-6), rel=1e-4)
    assert torch.isfinite(grad).all() and grad[0, 0] > 0.05 and grad[0, 1] < 0 and grad[0, 2] < 0


def test_penalty_gradient_at_mass_exactly_one():
    attention = torch.tensor([[1.0, 0.0, 0.0]], requires_grad=True)  # all attention on the impermissible token
    out = ExplainOutput(logits=torch.zeros(1, 2), attention=attention)
    value = DeceptionPenalty(weight=1.0, eps=1e-6)(out, {"impermissible": torch.tensor([[True, False, False]])})
    value.backward()
    assert value.item() == pytest.approx(-math.log(1e-6), rel=1e-4)
    grad = attention.grad[0]
    assert torch.isfinite(grad).all() and grad[0] > 0 and grad[1] < 0 and grad[2] < 0
    mass = torch.tensor([1.0], requires_grad=True)
    deception_penalty(mass, weight=1.0).backward()
    assert mass.grad.item() == pytest.approx(1e6, rel=1e-3)  # 1 / eps, not 0


def test_penalty_values_away_from_one_are_unchanged():
    attention = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.0, 0.0, 1.0, 0.0], [0.1, 0.1, 0.2, 0.6]])
    impermissible = torch.tensor([[True, False, False, False], [True, False, False, False], [True, True, False, False]])
    out = ExplainOutput(logits=torch.zeros(3, 2), attention=attention)
    value = DeceptionPenalty(weight=2.0)(out, {"impermissible": impermissible})
    expected = -2.0 * (math.log(0.5) + math.log(1.0) + math.log(0.8)) / 3
    assert value.item() == pytest.approx(expected, rel=1e-6)
    assert deception_penalty(torch.tensor([0.0, 0.5]), weight=1.0).item() == pytest.approx(math.log(2) / 2)


def _outputs_with_nan_attention(model):
    out = model(_BATCH)
    attention = out.attention.clone()
    attention[0, 1] = NAN
    return dataclasses.replace(out, attention=attention)


@pytest.mark.parametrize("name", sorted(_LOSSES))
def test_module_losses_warn_and_return_a_zero_that_keeps_the_weights_finite(name):
    model = _reference_model().train()
    loss = _LOSSES[name](1.0)
    out = model(_BATCH)
    if name in ("ConicityLoss", "WordTyingLoss"):
        hidden = out.hidden_states * torch.tensor([NAN, 1.0, 1.0, 1.0]).view(1, 4, 1)
        out = dataclasses.replace(out, hidden_states=hidden)
    else:
        out = dataclasses.replace(out, attention=out.attention * torch.tensor([1.0, NAN, 1.0, 1.0]))
    with pytest.warns(RuntimeWarning, match=rf"{name}: .*NaN or infinite values.*set to 0"):
        value = loss(out, _BATCH, model=model)
    assert value.item() == 0.0 and loss.nonfinite_batches == 1
    value.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    healthy = _LOSSES[name](1.0)(model(_BATCH), _BATCH, model=model)  # happy path: a finite, nonzero loss
    assert torch.isfinite(healthy) and healthy.item() != 0.0


def test_functional_losses_refuse_nan_inputs():
    attention = torch.tensor([[0.5, NAN]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="deception_penalty: mass holds NaN"):
        deception_penalty(torch.tensor([NAN]))
    with pytest.raises(ValueError, match="attention_alignment_kl: attention holds NaN"):
        attention_alignment_kl(attention, torch.ones(1, 2), mask)
    with pytest.raises(ValueError, match="rationale_supervision: attention holds NaN"):
        rationale_supervision(attention, torch.tensor([[True, False]]), mask)
    with pytest.raises(ValueError, match="conicity: hidden holds NaN"):
        conicity(torch.full((1, 2, 3), INF), mask)
    with pytest.raises(ValueError, match="model_consistent_adversary_loss: adv_attention holds NaN"):
        model_consistent_adversary_loss(torch.zeros(1, 2), torch.full((1, 2), 0.5), attention, torch.full((1, 2), 0.5))


class _OneBadBatch(AttentionClassifier):
    """The reference model, except that its reported attention is NaN on the second training batch (logits fine)."""

    poisoned_step = 1

    def training_step(self, batch, batch_idx):
        self._poison = batch_idx == self.poisoned_step
        return super().training_step(batch, batch_idx)

    def forward(self, batch):
        out = super().forward(batch)
        if getattr(self, "_poison", False):
            out = dataclasses.replace(out, attention=out.attention * NAN)
        return out


def test_fit_with_a_nan_attention_batch_keeps_the_weights_finite(tmp_path):
    dm = kit.make_dm(impermissible=True)
    objectives = [
        DeceptionPenalty(weight=0.5),
        ErasureFaithfulnessLoss(weight=0.5),
        RationaleSupervisionLoss(weight=0.5, key="impermissible"),
    ]
    torch.manual_seed(0)
    model = _OneBadBatch(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, objectives=objectives)
    loader = DataLoader(Subset(dm.dataset("train"), range(64)), batch_size=16, collate_fn=collate)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(RuntimeWarning, match="NaN or infinite values on this batch"):
        kit.make_trainer(tmp_path, max_steps=4).fit(model, loader)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))  # it did train
    assert [o.nonfinite_batches for o in objectives] == [1, 1, 1]

"""A loss with a value has the gradient of that value (issue 29, "silent wrong numbers").

Before: ``DeceptionPenalty(reduction="max")`` with one all-impermissible row was 13.8 (−log eps) with a zero
gradient to every parameter — that row cannot move any attention, and as the max it hid every other row; and
``AttentionAlignmentLoss`` (KL(s ‖ α) through ``kl_divergence``) on near one-hot attention had a value of about 16
with a gradient of 1e-8, because log(α + eps) has the gradient dα / (α + eps) ≈ 0 where α << eps.
Now the dead rows count 0 with a warning (as rows without impermissible tokens do) and the KL keeps eps in its
value but takes the exact gradient d log α. Both are checked against hand-written autograd.
"""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import ExplainOutput
from lightning_xai.losses import DeceptionPenalty
from lightning_xai.losses.alignment import attention_alignment_kl

IMPERMISSIBLE = torch.tensor([[True, True, True], [True, False, False], [False, True, False]])


def _scores() -> torch.Tensor:
    return torch.tensor([[0.3, -0.2, 0.5], [1.0, 0.0, -1.0], [0.2, 2.0, -0.4]], dtype=torch.float64, requires_grad=True)


def _hand(scores: torch.Tensor, rows) -> torch.Tensor:
    """−log(Σ_{j∉I} α_j) per row, from the log-softmax (the exact penalty −log(1 − m))."""
    log_alpha = torch.log_softmax(scores, -1)
    return torch.stack([-torch.logsumexp(log_alpha[b][~IMPERMISSIBLE[b]], 0) for b in rows])


@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_deception_penalty_with_an_all_impermissible_row_keeps_the_other_rows_gradient(reduction):
    scores = _scores()
    out = ExplainOutput(logits=torch.zeros(3, 2), attention=scores.softmax(-1))
    batch = {"impermissible": IMPERMISSIBLE, "mask": torch.ones(3, 3, dtype=torch.bool)}
    with pytest.warns(RuntimeWarning, match=r"1 row\(s\) have no permissible real token"):
        value = DeceptionPenalty(weight=1.0, reduction=reduction)(out, batch)
    value.backward()
    oracle_scores = _scores()
    terms = _hand(oracle_scores, [1, 2])
    want = terms.max() if reduction == "max" else terms.sum() / 3  # the dead row counts 0 in the mean
    want.backward()
    assert float(value) == pytest.approx(float(want), rel=1e-9)
    torch.testing.assert_close(scores.grad, oracle_scores.grad, rtol=1e-7, atol=1e-12)
    assert scores.grad.abs().sum() > 0.1  # before: exactly 0 under "max"


def test_a_pad_is_not_a_permissible_token():
    """Row 0's only non-impermissible position is a pad (attention 0, no gradient): the row is dead."""
    scores = torch.tensor([[0.3, -0.2, -1e9]], dtype=torch.float64, requires_grad=True)
    out = ExplainOutput(logits=torch.zeros(1, 2), attention=scores.softmax(-1))
    batch = {"impermissible": torch.tensor([[True, True, False]]), "mask": torch.tensor([[True, True, False]])}
    with pytest.warns(RuntimeWarning, match="no permissible real token"):
        assert float(DeceptionPenalty(weight=1.0)(out, batch)) == 0.0


def test_deception_penalty_without_dead_rows_is_unchanged():
    scores = _scores()
    out = ExplainOutput(logits=torch.zeros(2, 2), attention=scores[1:].softmax(-1))
    value = DeceptionPenalty(weight=1.0, reduction="max")(
        out, {"impermissible": IMPERMISSIBLE[1:], "mask": torch.ones(2, 3, dtype=torch.bool)}
    )
    value.backward()
    oracle_scores = _scores()
    _hand(oracle_scores, [1, 2]).max().backward()
    torch.testing.assert_close(scores.grad, oracle_scores.grad, rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("peak", [2.0, 40.0])
def test_alignment_kl_gradient_is_the_exact_kl_gradient_even_on_near_one_hot_attention(peak):
    """KL(s ‖ softmax(z)) has the gradient softmax(z) − s; at peak 40 the other weights are 4e-18 << eps."""
    z = torch.tensor([[peak, 0.0, 0.0, 0.0], [0.5, -0.5, 0.1, 0.0]], dtype=torch.float64, requires_grad=True)
    saliency = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.1, 0.4, 0.3, 0.2]], dtype=torch.float64)
    mask = torch.ones(2, 4, dtype=torch.bool)
    value = attention_alignment_kl(z.softmax(-1), saliency, mask)
    value.backward()
    target = saliency / saliency.sum(-1, keepdim=True)
    z_hand = z.detach().clone().requires_grad_(True)
    exact = (target * (target.log() - torch.log_softmax(z_hand, -1))).sum(-1).mean()
    exact.backward()
    torch.testing.assert_close(z.grad, z_hand.grad, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(z.grad, (z.softmax(-1) - target).detach() / 2, rtol=1e-6, atol=1e-9)
    if peak < 10:  # far from eps the value is the exact KL (eps = 1e-10 inside the logs)
        assert float(value) == pytest.approx(float(exact), abs=1e-8)

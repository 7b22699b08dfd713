"""torch.autograd.gradcheck in float64 for every loss, on small inputs."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

from lightning_xai.adapters import ExplainOutput
from lightning_xai.losses import (
    AttentionAlignmentLoss,
    ConicityLoss,
    DeceptionPenalty,
    ErasureFaithfulnessLoss,
    attention_alignment_kl,
    conicity,
    model_consistent_adversary_loss,
    soft_top_k_mask,
)
from lightning_xai.models import AttentionClassifier, masked_softmax

MASK = torch.tensor([[True, True, True, True], [True, True, True, False]])


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    return masked_softmax(scores, MASK)


@pytest.mark.parametrize("reduction", ["mean", "max"])
def test_deception_penalty_token_attention(reduction):
    torch.manual_seed(0)
    scores = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    batch = {"impermissible": torch.tensor([[True, False, True, False], [False, True, False, False]])}
    penalty = DeceptionPenalty(weight=0.7, reduction=reduction)

    def f(s):
        return penalty(ExplainOutput(logits=torch.zeros(2, 2, dtype=torch.float64), attention=_softmax(s)), batch)

    assert gradcheck(f, (scores,))


@pytest.mark.parametrize("reduction", ["mean", "max"])
def test_deception_penalty_multi_head(reduction):
    torch.manual_seed(1)
    scores = torch.randn(2, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    batch = {"impermissible": torch.tensor([[False, True, True, False], [False, False, True, False]])}
    penalty = DeceptionPenalty(weight=1.0, reduction=reduction, layers=[-1, 0], heads=[0, 2])

    def f(s):
        raw = (s.softmax(-1), (s * 0.5).softmax(-1))
        return penalty(
            ExplainOutput(logits=torch.zeros(2, 2, dtype=torch.float64), attention=raw[1][:, 0, 0], raw_attentions=raw),
            batch,
        )

    assert gradcheck(f, (scores,))


def test_adversary_loss():
    torch.manual_seed(2)
    logits = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    scores = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    base_probs = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]], dtype=torch.float64)
    base_attention = _softmax(torch.randn(2, 4, dtype=torch.float64))

    def f(lg, s):
        return model_consistent_adversary_loss(lg, base_probs, _softmax(s), base_attention, weight=0.3)["loss"]

    assert gradcheck(f, (logits, scores))


def test_conicity():
    torch.manual_seed(3)
    hidden = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda h: conicity(h, MASK), (hidden,))
    loss = ConicityLoss(weight=0.5)
    assert gradcheck(
        lambda h: loss(
            ExplainOutput(logits=torch.zeros(2, 2), attention=MASK.double(), hidden_states=h), {"mask": MASK}
        ),
        (hidden,),
    )


def test_soft_top_k_mask():
    torch.manual_seed(4)
    scores = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda s: soft_top_k_mask(_softmax(s), MASK, fraction=0.4, temperature=0.5), (scores,))


def _tiny_model() -> AttentionClassifier:
    torch.manual_seed(5)
    return AttentionClassifier(vocab_size=12, num_classes=2, embedding_dim=4, hidden_dim=3).double()


@pytest.mark.parametrize("mode", ["attention", "input"])
def test_erasure_loss(mode):
    model = _tiny_model()
    batch = {"input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0]]), "mask": MASK}
    loss = ErasureFaithfulnessLoss(fraction=0.3, temperature=0.5, mode=mode)
    reference = model(batch)
    scores = reference.attention_scores.detach().masked_fill(~MASK, 0.0).requires_grad_(True)

    def f(s):
        out = ExplainOutput(
            logits=reference.logits.detach(), attention=_softmax(s), hidden_states=reference.hidden_states.detach()
        )
        return loss(out, batch, model=model)

    assert gradcheck(f, (scores,))


def test_alignment_kl_and_loss():
    torch.manual_seed(6)
    scores = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    saliency = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    for direction in ("saliency_to_attention", "attention_to_saliency"):
        assert gradcheck(lambda s, g, d=direction: attention_alignment_kl(_softmax(s), g, MASK, d), (scores, saliency))
    # the module with create_graph=True differentiates through the saliency map too
    loss = AttentionAlignmentLoss(lambda model, batch, create_graph=False: batch["saliency"], create_graph=True)

    def f(s, g):
        out = ExplainOutput(logits=torch.zeros(2, 2, dtype=torch.float64), attention=_softmax(s))
        return loss(out, {"mask": MASK, "saliency": g}, model=object())

    assert gradcheck(f, (scores, saliency))

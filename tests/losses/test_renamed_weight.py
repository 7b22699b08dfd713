"""Issue 13: every loss calls its strength ``weight`` (``lam``, the name DeceptionPenalty and
ModelConsistentAdversary used before, was removed before the first release: issue 28)."""

import warnings

import pytest
import torch

from lightning_xai.adapters import ExplainOutput
from lightning_xai.losses import DeceptionPenalty, ModelConsistentAdversary, model_consistent_adversary_loss
from lightning_xai.models import AttentionClassifier

BATCH = {
    "input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0]]),
    "mask": torch.tensor([[True, True, True, True], [True, True, True, False]]),
    "impermissible": torch.tensor([[True, False, True, False], [False, True, False, False]]),
}
OUT = ExplainOutput(logits=torch.zeros(2, 2), attention=torch.tensor([[0.4, 0.1, 0.3, 0.2], [0.2, 0.5, 0.3, 0.0]]))


def test_deception_penalty_weight():
    new = DeceptionPenalty(weight=0.3)
    assert new.weight == 0.3
    # the oracle: -0.3 * mean log(1 - mass), masses 0.7 and 0.5
    expected = -0.3 * (torch.log(torch.tensor(0.3)) + torch.log(torch.tensor(0.5))) / 2
    assert new(OUT, BATCH).item() == pytest.approx(expected.item(), rel=1e-6)
    new.weight = 2.0
    assert new.weight == 2.0 and "weight=2.0" in repr(new)
    with pytest.raises(TypeError, match="lam"):
        DeceptionPenalty(lam=0.3)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        DeceptionPenalty(weight=-1.0)


def test_the_adversary_function_weight():
    args = (torch.zeros(1, 2), torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]]))
    new_terms = model_consistent_adversary_loss(*args, weight=0.4)
    assert new_terms["loss"].item() == pytest.approx(-0.4 * torch.log(torch.tensor(2.0)).item(), rel=1e-6)


def test_model_consistent_adversary_weight():
    torch.manual_seed(0)
    base = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
    with pytest.raises(TypeError, match="lam"):
        ModelConsistentAdversary(base, lam=0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the name warns about nothing
        ModelConsistentAdversary(base, weight=0.25)
        DeceptionPenalty(weight=1.0)

"""Issue 13: every loss calls its strength ``weight``; ``lam`` (DeceptionPenalty, ModelConsistentAdversary and their
functions) keeps working with a DeprecationWarning and gives the same values."""
import warnings

import pytest
import torch

from lightning_xai.adapters import ExplainOutput
from lightning_xai.losses import (DeceptionPenalty, ModelConsistentAdversary, deception_penalty,
                                  model_consistent_adversary_loss)
from lightning_xai.models import AttentionClassifier

BATCH = {"input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0]]),
         "mask": torch.tensor([[True, True, True, True], [True, True, True, False]]),
         "impermissible": torch.tensor([[True, False, True, False], [False, True, False, False]])}
OUT = ExplainOutput(logits=torch.zeros(2, 2), attention=torch.tensor([[0.4, 0.1, 0.3, 0.2], [0.2, 0.5, 0.3, 0.0]]))


def test_deception_penalty_lam_is_deprecated_and_equal_to_weight():
    new = DeceptionPenalty(weight=0.3)
    with pytest.warns(DeprecationWarning, match="lam= is deprecated, use weight="):
        old = DeceptionPenalty(lam=0.3)
    assert old.weight == new.weight == 0.3
    assert torch.equal(old(OUT, BATCH), new(OUT, BATCH))
    # the oracle: -0.3 * mean log(1 - mass), masses 0.7 and 0.5
    expected = -0.3 * (torch.log(torch.tensor(0.3)) + torch.log(torch.tensor(0.5))) / 2
    assert new(OUT, BATCH).item() == pytest.approx(expected.item(), rel=1e-6)
    with pytest.warns(DeprecationWarning, match=r"DeceptionPenalty\.lam is deprecated"):
        assert new.lam == 0.3
    with pytest.warns(DeprecationWarning):
        new.lam = 2.0
    assert new.weight == 2.0 and "weight=2.0" in repr(new)
    with pytest.raises(TypeError, match="pass weight only"):
        DeceptionPenalty(weight=0.5, lam=0.3)
    with pytest.raises(ValueError, match="weight must be >= 0"):
        DeceptionPenalty(weight=-1.0)


def test_functions_accept_lam_with_a_warning():
    mass = torch.tensor([0.2, 0.6])
    with pytest.warns(DeprecationWarning):
        old = deception_penalty(mass, lam=0.7, reduction="max")
    assert torch.equal(old, deception_penalty(mass, 0.7, "max"))
    args = (torch.zeros(1, 2), torch.tensor([[0.5, 0.5]]), torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]]))
    with pytest.warns(DeprecationWarning):
        old_terms = model_consistent_adversary_loss(*args, lam=0.4)
    new_terms = model_consistent_adversary_loss(*args, weight=0.4)
    assert torch.equal(old_terms["loss"], new_terms["loss"])
    assert new_terms["loss"].item() == pytest.approx(-0.4 * torch.log(torch.tensor(2.0)).item(), rel=1e-6)


def test_model_consistent_adversary_lam_is_deprecated():
    torch.manual_seed(0)
    base = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
    adversary = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
    with pytest.warns(DeprecationWarning, match="ModelConsistentAdversary: lam= is deprecated"):
        old = ModelConsistentAdversary(base, lam=0.25)
    new = ModelConsistentAdversary(base, weight=0.25)
    out = adversary(BATCH)
    assert torch.equal(old(out, BATCH), new(out, BATCH))
    with pytest.warns(DeprecationWarning):
        assert old.lam == 0.25
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns about nothing
        ModelConsistentAdversary(base, weight=0.25)
        DeceptionPenalty(weight=1.0)

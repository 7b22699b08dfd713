"""Erasure metrics on a model whose logits are NaN give NaN with the undefined warning (issue 29).

Before, ``comprehensiveness`` / ``decision_flip`` on a NaN model raised ``RuntimeError: atol must be greater than or
equal to zero, but got -nan`` from the padding-trim check (its tolerance was scaled by the NaN logits). Now the
trim is simply not used when it cannot be verified, and the results are NaN with the ``RuntimeWarning`` that
names the rows, as the callbacks record such rows as undefined. A finite model keeps finite values.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_xai.metrics.functional import comprehensiveness, decision_flip, sufficiency
from lightning_xai.models import AttentionClassifier


def _model(nan: bool) -> AttentionClassifier:
    torch.manual_seed(0)
    model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval()
    if nan:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(math.nan)
    return model


BATCH = {
    "input_ids": torch.tensor([[3, 4, 5, 6], [3, 4, 5, 0]]),
    "mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]).bool(),
}
SCORES = torch.tensor([[0.1, 0.9, 0.2, 0.3], [0.5, 0.1, 0.7, 0.0]])


@pytest.mark.parametrize("fn", [comprehensiveness, sufficiency], ids=lambda f: f.__name__)
def test_faithfulness_of_a_nan_model_is_nan_with_a_warning(fn):
    with pytest.warns(RuntimeWarning, match=r"logits are not finite \(NaN or inf in rows \[0, 1\]\)"):
        values = fn(_model(nan=True), BATCH, SCORES, k=1)
    assert torch.isnan(values).all()
    assert torch.isfinite(fn(_model(nan=False), BATCH, SCORES, k=1)).all()


@pytest.mark.parametrize("ranking", ["attention", "random"])
def test_decision_flip_of_a_nan_model_is_undefined_with_a_warning(ranking):
    with pytest.warns(RuntimeWarning, match=r"logits are not finite"):
        result = decision_flip(_model(nan=True), BATCH, ranking, generator=torch.Generator().manual_seed(0))
    assert torch.isnan(result.attention_removed).all() and torch.isnan(result.fraction_removed).all()
    assert not result.flipped.any() and (result.items_removed == -1).all()
    fine = decision_flip(_model(nan=False), BATCH, ranking, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(fine.attention_removed).all() and torch.isfinite(fine.fraction_removed).all()

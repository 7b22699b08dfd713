"""Issue 30 item 3 at the audits: the measures defined on one softmax output distribution (total variation between
outputs, argmax flips) refuse a regression or multi-label head by name instead of a silent wrong number (a softmax
of one regression value is the constant 1: every TVD 0, nothing ever flips)."""

from __future__ import annotations

import pytest
import torch

from lightning_xai.audits.adversarial import adversarial_attention_search
from lightning_xai.audits.baselines import permutation_test, uniform_attention_evaluation
from lightning_xai.audits.seed_variance import attention_divergence
from lightning_xai.models import AttentionClassifier


class _Regression(AttentionClassifier):  # the head kind is what matters here, not the width
    head_kind = "regression"


class _MultiLabel(AttentionClassifier):
    head_kind = "sigmoid"


BATCH = {
    "input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
    "mask": torch.tensor([[1, 1, 1], [1, 1, 0]]).bool(),
    "labels": torch.tensor([0, 0]),
}

MEASURES = {
    "the adversarial attention search": lambda m: adversarial_attention_search(m, BATCH, steps=1),
    "the permutation test": lambda m: permutation_test(m, BATCH, num_permutations=2),
    "the uniform-attention evaluation": lambda m: uniform_attention_evaluation(m, BATCH),
    "attention_divergence": lambda m: attention_divergence(m, m, [BATCH]),
}


@pytest.mark.parametrize("name", list(MEASURES))
@pytest.mark.parametrize("cls,head", [(_Regression, "regression"), (_MultiLabel, "sigmoid")])
def test_softmax_measures_refuse_other_heads_by_name(name, cls, head):
    torch.manual_seed(0)
    model = cls(vocab_size=20, num_classes=2 if head == "regression" else 3, embedding_dim=8, hidden_dim=4).eval()
    with pytest.raises(ValueError, match=f"{name} compares softmax output distributions.*{head} head"):
        MEASURES[name](model)
    before = [m.training for m in model.modules()]
    assert before == [False] * len(before)  # modes untouched by the refusal


@pytest.mark.parametrize("name", list(MEASURES))
def test_softmax_classifiers_still_run(name):
    torch.manual_seed(0)
    MEASURES[name](AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval())

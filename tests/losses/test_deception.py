"""DeceptionPenalty against hand computation on a real BiLSTM batch and on synthetic multi-head maps."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_xai.adapters import ExplainOutput
from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.losses import DeceptionPenalty, deception_penalty
from lightning_xai.models import AttentionClassifier


@pytest.fixture(scope="module")
def wiki_batch():
    dm = TextClassificationDataModule("sst_wiki", batch_size=8)
    dm.setup("fit")
    dataset = dm.dataset("val")
    return dm, collate([dataset[i] for i in range(8)])


def test_bilstm_attention_matches_hand_computation(wiki_batch):
    dm, batch = wiki_batch
    assert batch["impermissible"].any()
    torch.manual_seed(0)
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, attention="linear")
    out = model(batch)
    logs = []
    for b in range(batch["input_ids"].shape[0]):
        mass = sum(
            float(out.attention.detach()[b, t]) for t in range(batch["mask"].shape[1]) if batch["impermissible"][b, t]
        )
        logs.append(math.log(1.0 - mass))
    for lam in (0.1, 1.0):
        mean = DeceptionPenalty(weight=lam, reduction="mean")(out, batch)
        worst = DeceptionPenalty(weight=lam, reduction="max")(out, batch)
        assert mean.item() == pytest.approx(-lam * sum(logs) / len(logs), rel=1e-5)
        assert worst.item() == pytest.approx(-lam * min(logs), rel=1e-5)
    DeceptionPenalty(weight=1.0)(out, batch).backward()
    assert model.attention.v.weight.grad is not None and model.attention.v.weight.grad.abs().sum() > 0


def test_multi_head_raw_attentions_match_hand_computation():
    torch.manual_seed(1)
    layers = tuple(torch.randn(3, 4, 6, 6).softmax(-1) for _ in range(2))
    impermissible = torch.tensor([[0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 1, 1]], dtype=torch.bool)
    out = ExplainOutput(logits=torch.zeros(3, 2), attention=torch.zeros(3, 6), raw_attentions=layers)
    batch = {"impermissible": impermissible}

    def hand(layer_ids, head_ids):
        values = []
        for b in range(3):
            for layer in layer_ids:
                for h in head_ids:
                    mass = sum(float(layers[layer][b, h, 0, j]) for j in range(6) if impermissible[b, j])
                    values.append(math.log(1.0 - mass))
        return values

    logs = hand([1], range(4))  # default: last layer, [CLS] row, every head
    assert DeceptionPenalty(weight=1.0)(out, batch).item() == pytest.approx(-sum(logs) / len(logs), rel=1e-5)
    assert DeceptionPenalty(weight=1.0, reduction="max")(out, batch).item() == pytest.approx(-min(logs), rel=1e-5)
    logs = hand([0], [1, 3])
    value = DeceptionPenalty(weight=0.1, layers=0, heads=[1, 3])(out, batch)
    assert value.item() == pytest.approx(-0.1 * sum(logs) / len(logs), rel=1e-5)
    # source="attention" ignores the raw maps
    assert DeceptionPenalty(weight=1.0, source="attention")(out, batch).item() == 0.0


def test_missing_key_and_bad_masks_raise_clear_errors():
    out = ExplainOutput(logits=torch.zeros(1, 2), attention=torch.tensor([[0.5, 0.5]]))
    with pytest.raises(KeyError, match="impermissible"):
        DeceptionPenalty(weight=1.0)(out, {"mask": torch.ones(1, 2, dtype=torch.bool)})
    with pytest.raises(TypeError, match="bool"):
        DeceptionPenalty(weight=1.0)(out, {"impermissible": torch.tensor([[1, 0]])})
    with pytest.raises(ValueError, match="aligned"):
        DeceptionPenalty(weight=1.0)(out, {"impermissible": torch.tensor([[True, False, False]])})
    with pytest.raises(ValueError, match="raw_attentions"):
        DeceptionPenalty(weight=1.0, source="raw")(out, {"impermissible": torch.tensor([[True, False]])})
    with pytest.raises(ValueError, match="reduction"):
        DeceptionPenalty(weight=1.0, reduction="sum")


def test_empty_impermissible_set_contributes_zero_and_is_counted():
    attention = torch.tensor([[0.2, 0.8], [0.6, 0.4]])
    out = ExplainOutput(logits=torch.zeros(2, 2), attention=attention)
    batch = {"impermissible": torch.tensor([[False, False], [True, False]])}
    penalty = DeceptionPenalty(weight=1.0)
    value = penalty(out, batch)
    assert value.item() == pytest.approx(-(math.log(1.0) + math.log(0.4)) / 2, rel=1e-6)
    assert (penalty.empty_examples, penalty.seen_examples) == (1, 2)
    penalty(out, batch)
    assert (penalty.empty_examples, penalty.seen_examples) == (2, 4)
    assert penalty.last_mass.item() == pytest.approx(0.3)


def test_mass_near_one_stays_finite_with_finite_gradients():
    scores = torch.tensor([[40.0, 0.0, 0.0]], requires_grad=True)
    attention = scores.softmax(-1)  # mass on token 0 is 1 - 2e-18 -> rounds to 1 in float32
    out = ExplainOutput(logits=torch.zeros(1, 2), attention=attention)
    value = DeceptionPenalty(weight=1.0, eps=1e-6)(out, {"impermissible": torch.tensor([[True, False, False]])})
    value.backward()
    assert torch.isfinite(value) and value.item() == pytest.approx(-math.log(1e-6), rel=1e-3)
    assert torch.isfinite(scores.grad).all()
    assert deception_penalty(torch.tensor([1.0, 1.0]), weight=1.0).isfinite()

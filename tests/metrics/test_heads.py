"""Issue 30 item 3 at the metrics: erasure scores and decision flips measured with the model's own head.

Before, a regression model (``num_labels=1``) got comprehensiveness 0.0 and "never flips" logged as real numbers (a
softmax of one logit is the constant 1, its argmax the constant 0), and a multi-label model's erasures were
measured through a softmax over its labels.
"""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.metrics.functional import comprehensiveness, decision_flip, sufficiency
from lightning_xai.metrics.functional.erasure import erasure_probabilities

pytest.importorskip("transformers")
from tests.adapters.conftest import tiny_batch, tiny_bert  # noqa: E402

SCORES = torch.tensor([[0.0, 0.1, 0.9, 0.3, 0.2, 0.0], [0.0, 0.8, 0.1, 0.0, 0.0, 0.0]])


def _regression():
    return HuggingFaceAdapter(tiny_bert(num_labels=1))


def _multi_label():
    model = tiny_bert(num_labels=3, seed=1)
    model.config.problem_type = "multi_label_classification"
    return HuggingFaceAdapter(model)


def _without(batch, row, positions):
    keep = [t for t in range(batch["input_ids"].shape[1]) if t not in positions]
    return {k: v[row : row + 1, keep] for k, v in batch.items() if k != "labels"}


def test_regression_comprehensiveness_is_the_change_of_the_output_value():
    adapter, batch = _regression(), tiny_batch()
    comp = comprehensiveness(adapter, batch, SCORES, k=1)  # the default: the change of the output value
    with torch.no_grad():
        value = adapter(batch).logits[:, 0]
        expected = torch.stack(
            [
                value[0] - adapter(_without(batch, 0, [2])).logits[0, 0],
                value[1] - adapter(_without(batch, 1, [1])).logits[0, 0],
            ]
        )
    assert torch.allclose(comp, expected, atol=1e-10)
    assert bool((comp != 0).all())  # not the 0.0 of a softmax of one value
    assert torch.equal(comprehensiveness(adapter, batch, SCORES, k=1, output="logit"), comp)


@pytest.mark.parametrize("measure", [comprehensiveness, sufficiency])
def test_a_probability_of_a_regression_head_is_refused_by_name(measure):
    with pytest.raises(ValueError, match="regression head.*output='logit'"):
        measure(_regression(), tiny_batch(), SCORES, k=1, output="probability")


def test_decision_flip_of_a_regression_head_is_refused_by_name():
    with pytest.raises(ValueError, match="regression head makes no decision"):
        decision_flip(_regression(), tiny_batch())


def test_multi_label_erasures_are_measured_with_the_labels_sigmoid():
    adapter, batch = _multi_label(), tiny_batch()
    with torch.no_grad():
        full = adapter(batch).logits
        erased = adapter(_without(batch, 0, [2])).logits
    target = torch.tensor([0, 2])
    comp = comprehensiveness(adapter, batch, SCORES, k=1, target=target)
    assert torch.allclose(comp[0], full[0, 0].sigmoid() - erased[0, 0].sigmoid(), atol=1e-10)
    remove = torch.zeros(2, 6, dtype=torch.bool)
    remove[0, 2] = True
    probs = erasure_probabilities(adapter, batch, [remove], target)
    assert torch.allclose(probs[0, 0], erased[0, 0].sigmoid(), atol=1e-10)
    assert torch.allclose(probs[0, 1], full[1, 2].sigmoid(), atol=1e-10)


def test_multi_label_decision_flip_is_a_change_of_the_label_set():
    adapter, batch = _multi_label(), tiny_batch()
    mask = batch["mask"]
    with torch.no_grad():
        out = adapter(batch)
        result = decision_flip(adapter, batch, "attention")
        labels = out.logits > 0
        assert bool(result.flipped.any()) and not bool(result.flipped.all())  # row 1's label 2 crosses 0.5
        for row in range(2):  # the hand loop: zero the s highest-attended tokens, renormalise, compare label sets
            alpha = out.attention[row : row + 1]
            order = alpha[0].masked_fill(~mask[row], -1).argsort(descending=True, stable=True)
            first = -1
            for step in range(1, int(mask[row].sum())):
                weights = alpha.clone()
                weights[0, order[:step]] = 0
                override = weights / weights.sum()
                logits = adapter(_without(batch, row, []), attention_override=override).logits
                if not torch.equal(logits[0] > 0, labels[row]):
                    first = step
                    break
            assert int(result.items_removed[row]) == first, row

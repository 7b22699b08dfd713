"""Issue 30 item 3: heads other than a softmax classifier explained as what they compute, against hand autograd.

A regression head (``num_labels=1``) has no probability: the softmax of one logit is the constant 1, so every map of
it was exactly 0.0. Now ``output="probability"`` is refused by name, and the default (``output=None``) and
``output="logit"`` explain the output value.
A multi-label head (``problem_type="multi_label_classification"``) was explained through a softmax over its labels;
now through each label's sigmoid, the probability the model itself reports.
"""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.adapters.capabilities import HeadKind, head_kind_of
from lightning_xai.attribution import attribute, gather_rows
from lightning_xai.attribution.heads import decisions, default_output, explained_quantity, label_targets
from lightning_xai.attribution.targets import score_values

pytest.importorskip("transformers")
from tests.adapters.conftest import tiny_batch, tiny_bert  # noqa: E402


def _regression():
    return HuggingFaceAdapter(tiny_bert(num_labels=1))


def _multi_label():
    model = tiny_bert(num_labels=3, seed=1)
    model.config.problem_type = "multi_label_classification"
    return HuggingFaceAdapter(model)


def _hand_gradient(adapter, batch, score):
    """‖∂ score(logits)/∂ word embedding‖₂ per token, by hand through the model's own forward."""
    model = adapter.model
    emb = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)
    logits = model(
        inputs_embeds=emb, attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
    ).logits
    (grad,) = torch.autograd.grad(score(logits).sum(), emb)
    return grad.norm(dim=-1).masked_fill(~batch["mask"], 0.0)


def test_the_adapter_reads_the_head_from_the_config():
    assert head_kind_of(_regression()) == "regression" and isinstance(_regression(), HeadKind)
    assert head_kind_of(_multi_label()) == "sigmoid"
    assert head_kind_of(HuggingFaceAdapter(tiny_bert())) == "softmax"
    model = tiny_bert(num_labels=1)
    model.config.problem_type = "single_label_classification"  # one class read by name: what the config says
    assert head_kind_of(HuggingFaceAdapter(model)) == "softmax"


def test_regression_maps_are_the_gradient_of_the_output_value():
    adapter, batch = _regression(), tiny_batch()
    scores = attribute(adapter, batch, "gradient", output="logit")
    expected = _hand_gradient(adapter, batch, lambda logits: logits[:, 0])
    assert torch.allclose(scores, expected, atol=1e-10, rtol=1e-8)
    assert torch.equal(attribute(adapter, batch, "gradient"), scores)  # the default explains the value too
    assert bool((scores[batch["mask"]] > 0).all())  # not the all-zero map of a softmax of one value
    assert default_output(adapter) == "logit" and explained_quantity(adapter) == "regression output value"


@pytest.mark.parametrize(
    "method,options",
    [("gradient", {}), ("integrated_gradients", {"n_steps": 8}), ("leave_one_out", {}), ("grad_x_input", {})],
)
def test_a_probability_of_a_regression_head_is_refused_by_name(method, options):
    for output in ("probability", "log_probability"):
        with pytest.raises(ValueError, match="regression head.*output='logit'"):
            attribute(_regression(), tiny_batch(), method, output=output, **options)


def test_regression_leave_one_out_is_the_change_of_the_output_value():
    adapter, batch = _regression(), tiny_batch()
    scores = attribute(adapter, batch, "leave_one_out", output="logit", signed=True)
    with torch.no_grad():
        full = adapter(batch).logits[0, 0]
        keep = [0, 1, 3, 4, 5]  # row 0 without its token at position 2
        short = {k: v[:1, keep] for k, v in batch.items() if k != "labels"}
        without = adapter(short).logits[0, 0]
    assert torch.allclose(scores[0, 2], full - without, atol=1e-10)


def test_regression_integrated_gradients_is_complete_in_the_output_value():
    adapter, batch = _regression(), tiny_batch()
    ig, delta = attribute(
        adapter, batch, "integrated_gradients", output="logit", n_steps=64, return_convergence_delta=True
    )
    with torch.no_grad():
        value = adapter(batch).logits[:, 0]
        zero = adapter.embed(batch).masked_fill(batch["mask"].unsqueeze(-1), 0.0)  # the real tokens' zero baseline
        base = adapter.forward_from_embeddings(zero, batch).logits[:, 0]
    assert torch.allclose(ig.sum(-1) - delta, value - base, atol=1e-8)
    assert float(ig.abs().sum()) > 0


@pytest.mark.parametrize("label", [0, 2])
def test_multi_label_maps_are_the_gradient_of_the_labels_sigmoid(label):
    adapter, batch = _multi_label(), tiny_batch()
    scores = attribute(adapter, batch, "gradient", target=label)
    expected = _hand_gradient(adapter, batch, lambda logits: logits[:, label].sigmoid())
    assert torch.allclose(scores, expected, atol=1e-10, rtol=1e-8)
    softmaxed = _hand_gradient(adapter, batch, lambda logits: logits.softmax(-1)[:, label])
    assert not torch.allclose(scores, softmaxed, atol=1e-6)  # the old, wrong quantity
    assert explained_quantity(adapter) == "sigmoid probability of the target label"


def test_multi_label_probability_is_the_models_sigmoid():
    adapter, batch = _multi_label(), tiny_batch()
    with torch.no_grad():
        logits = adapter(batch).logits
    assert torch.equal(score_values(logits, "probability", head_kind_of(adapter)), logits.sigmoid())


def test_each_predicted_label_is_explained_on_its_own():
    adapter, batch = _multi_label(), tiny_batch()
    with torch.no_grad():
        logits = adapter(batch).logits
    rows, labels = label_targets(logits, "sigmoid")
    assert torch.equal(torch.stack([rows, labels], 1), (logits.sigmoid() > 0.5).nonzero())
    assert rows.numel() >= 2  # the tiny model predicts several labels of some row
    maps = attribute(adapter, gather_rows(batch, rows, 2), "gradient", target=labels)
    for i, (row, label) in enumerate(zip(rows.tolist(), labels.tolist())):
        one = attribute(adapter, gather_rows(batch, torch.tensor([row]), 2), "gradient", target=label)
        assert torch.allclose(maps[i], one[0], atol=1e-12)


def test_a_regression_head_makes_no_decision():
    with pytest.raises(ValueError, match="regression head makes no decision"):
        decisions(torch.zeros(2, 1), "regression")

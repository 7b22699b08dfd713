"""Saliency sanity checks on the trained reference BiLSTM: Kindermans input invariance, Adebayo randomisation,
IG completeness / LRP conservation. Oracles: scipy's Kendall τ-b, Captum's Saliency / InputXGradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from captum.attr import InputXGradient, Saliency
from scipy.stats import kendalltau

from lightning_xai.audits.sanity import (
    SanityTable,
    completeness,
    input_invariance,
    model_randomization,
    run_sanity_checks,
    shifted_model,
)
from lightning_xai.metrics.functional import kendall_tau
from lightning_xai.models import AttentionClassifier


def kendall_tau_b(a, b, mask):
    """The τ-b the sanity checks use (the removed audits.sanity.kendall_tau_b was this call)."""
    return kendall_tau(a.double(), b.double(), mask)[0]


def test_kendall_tau_b_matches_scipy_with_ties_and_masks():
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(0, 4, (12, 15), generator=generator).double()  # many ties
    b = torch.randn(12, 15, generator=generator)
    b[:, ::3] = 0.0
    lengths = torch.randint(2, 16, (12,), generator=generator)
    mask = torch.arange(15).unsqueeze(0) < lengths.unsqueeze(1)
    ours = kendall_tau_b(a, b, mask)
    for row in range(12):
        n = int(lengths[row])
        expected = kendalltau(a[row, :n].numpy(), b[row, :n].numpy(), variant="b").statistic
        if math.isnan(expected):
            assert math.isnan(float(ours[row]))
        else:
            assert float(ours[row]) == pytest.approx(expected, abs=1e-12)
    assert kendall_tau_b(torch.ones(1, 3), torch.arange(3.0).unsqueeze(0), torch.ones(1, 3, dtype=torch.bool)).isnan()


@pytest.mark.parametrize("encoder", ["bilstm", "lstm", "mlp"])
def test_shifted_model_is_the_same_function(encoder, sst2_batch):
    torch.manual_seed(0)
    model = AttentionClassifier(20000, encoder=encoder, embedding_dim=12, hidden_dim=6).double().eval()
    shift = torch.linspace(-2, 2, 12, dtype=torch.double)
    other = shifted_model(model, shift)
    torch.testing.assert_close(other(sst2_batch).logits, model(sst2_batch).logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(other.embed(sst2_batch), model.embed(sst2_batch) + shift)
    assert not torch.equal(model.embedding.weight, other.embedding.weight)  # the original is untouched


def test_shift_errors(sst2_batch):
    cnn = AttentionClassifier(20000, encoder="cnn", embedding_dim=8, hidden_dim=4)
    with pytest.raises(ValueError, match="CNN zero-pads its borders"):
        shifted_model(cnn, 1.0)
    lstm = AttentionClassifier(20000, embedding_dim=8, hidden_dim=4)
    with pytest.raises(ValueError, match=r"\[8\] vector"):
        shifted_model(lstm, torch.ones(3))


def _captum_maps(model, batch, target):
    embeddings = model.embed(batch).detach()
    forward = lambda emb: model.forward_from_embeddings(emb, batch).logits.softmax(-1)  # noqa: E731
    grad = Saliency(forward).attribute(embeddings, target=target, abs=False)
    gxi = InputXGradient(forward).attribute(embeddings, target=target)
    return grad, gxi


def test_kindermans_gradient_invariant_grad_x_input_not(trained_model, sst2_batch):
    """The oracle: Captum's raw gradients are equal on the two models, Captum's grad×input is not."""
    target = trained_model(sst2_batch).logits.argmax(-1)
    other = shifted_model(trained_model, 0.3)
    grad, gxi = _captum_maps(trained_model, sst2_batch, target)
    grad_s, gxi_s = _captum_maps(other, sst2_batch, target)
    torch.testing.assert_close(grad_s, grad, rtol=1e-3, atol=1e-6)
    assert not torch.allclose(gxi_s.sum(-1), gxi.sum(-1), rtol=1e-2, atol=1e-4)

    table = input_invariance(trained_model, sst2_batch)
    assert isinstance(table, SanityTable)
    assert table.row(method="model (logits)")["passes"]
    passes = {row["method"]: row["passes"] for row in table.rows}
    assert passes == {
        "model (logits)": True,
        "attention": True,
        "gradient": True,
        "grad_x_input": False,
        "integrated_gradients (zero baseline)": False,
        "integrated_gradients (pad baseline)": True,
        "leave_one_out": True,
        "lrp": False,
    }
    assert table.row(method="grad_x_input")["relative_change"] > 0.1
    per_example = table.per_example
    assert per_example["gradient/passes"].eq(1).all() and per_example["grad_x_input/passes"].eq(0).any()
    assert "| gradient | True |" in table.to_markdown()


def test_randomization_decorrelates_gradient_methods(trained_model, sst2_batch):
    methods = [
        "attention",
        "gradient",
        "grad_x_input",
        ("integrated_gradients", "integrated_gradients", {"n_steps": 16}),
        "lrp",
    ]
    table = model_randomization(trained_model, sst2_batch, methods)
    assert table.column("stage")[0] == "classifier" and table.column("stage")[-1] == "+embedding"
    # attention never looks at the classifier: randomising it leaves the map identical (a failed check)
    assert table.row(stage="classifier", method="attention")["tau"] == pytest.approx(1.0)
    for method in ("grad_x_input", "integrated_gradients", "lrp"):
        assert abs(table.row(stage="+embedding", method=method)["tau"]) < 0.15, table
        assert abs(table.row(stage="classifier", method=method)["tau"]) < 0.3, table
    # the gradient *norm* keeps some positional structure until the embeddings are re-drawn
    assert table.row(stage="+embedding", method="gradient")["tau"] < 0.3
    assert table.row(stage="+encoder", method="gradient")["tau"] > 0.3
    assert table.per_example["cascading/embedding/lrp/tau"].shape == (16,)

    independent = model_randomization(
        trained_model, sst2_batch, ["grad_x_input"], mode="independent", layers=["attention", "embedding"]
    )
    assert independent.column("stage") == ["attention", "embedding"]
    # re-drawing the attention scorer alone barely moves grad×input: the LSTM carries the signal
    assert independent.row(stage="attention")["tau"] > 0.8


def test_randomization_leaves_the_model_alone(trained_model, sst2_batch):
    before = {k: v.clone() for k, v in trained_model.state_dict().items()}
    rng = torch.get_rng_state()
    model_randomization(trained_model, sst2_batch, ["gradient"])
    for key, value in trained_model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert torch.equal(torch.get_rng_state(), rng)


def test_completeness_table(trained_model, sst2_batch):
    table = completeness(trained_model, sst2_batch, n_steps=(8, 32))
    assert table.row(method="integrated_gradients", setting="n_steps=32, baseline=zero")["passes"]
    assert table.row(setting="bias_factor=1")["max_rel_error"] < 0.01
    assert not table.row(setting="bias_factor=0")["passes"]
    cnn = AttentionClassifier(20000, encoder="cnn", embedding_dim=8, hidden_dim=4).eval()
    assert [r["method"] for r in completeness(cnn, sst2_batch, n_steps=(8,)).rows] == ["integrated_gradients"]


def test_run_sanity_checks_routes_options_and_rejects_unknown(trained_model, sst2_batch):
    tables = run_sanity_checks(
        trained_model,
        sst2_batch,
        checks=["input_invariance", "completeness"],
        input_invariance_methods=["gradient"],
        completeness_n_steps=(8,),
    )
    assert [r["method"] for r in tables["input_invariance"].rows] == ["model (logits)", "gradient"]
    with pytest.raises(TypeError, match="match no check"):
        run_sanity_checks(trained_model, sst2_batch, checks=["completeness"], input_invariance_methods=["gradient"])
    with pytest.raises(ValueError, match="Unknown sanity check"):
        run_sanity_checks(trained_model, sst2_batch, checks=["smell_test"])
    with pytest.raises(ValueError, match="cascading"):
        model_randomization(trained_model, sst2_batch, ["gradient"], mode="random")
    with pytest.raises(ValueError, match="no sub-module 'decoder'"):
        model_randomization(trained_model, sst2_batch, ["gradient"], layers=["decoder"])
    with pytest.raises(TypeError, match="triple"):
        input_invariance(trained_model, sst2_batch, [("gradient", {})])
    assert np.isfinite(tables["completeness"].column("max_rel_error")).all()

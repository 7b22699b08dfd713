"""Every method of attribute() against Captum on the trained reference model in float64 (tolerance 1e-5)."""

from __future__ import annotations

import copy

import pytest
import torch
from captum.attr import (
    FeatureAblation,
    InputXGradient,
    IntegratedGradients,
    LayerIntegratedGradients,
    NoiseTunnel,
    Saliency,
)

from lightning_xai.attribution import attribute


def _close(actual, expected):
    """Agreement within 1e-5 relative to the map's scale (and elementwise rtol 1e-5)."""
    scale = expected.abs().max().item()
    assert scale > 0, "oracle map is all zero: the comparison could not fail"
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale)


def _forward_over_embeddings(model, batch):
    """Captum forward function over embeddings; per-example batch tensors come as additional_forward_args."""
    keys = [k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.shape[0] == batch["mask"].shape[0]]

    def forward(emb, *values):
        return model.forward_from_embeddings(emb, dict(zip(keys, values))).logits.softmax(-1)

    return forward, tuple(batch[k] for k in keys)


def _embeddings(model, batch):
    with torch.no_grad():
        return model.embed(batch).detach()


@pytest.fixture(scope="module")
def target16(model64, batch16):
    with torch.no_grad():
        return model64(batch16).logits.argmax(-1)


@pytest.fixture(scope="module")
def model_padrow(model64):
    """The float64 model with a non-zero pad embedding, so the pad baseline differs from the zero baseline.

    The packed BiLSTM never reads pads, so predictions are unchanged; only baselines/occlusions see the row.
    """
    model = copy.deepcopy(model64)
    with torch.no_grad():
        model.embedding.weight[0] = torch.linspace(-0.3, 0.3, model.embedding.weight.shape[1], dtype=torch.float64)
    return model


def _pad_baseline(model, batch, emb):
    return torch.where(batch["mask"].unsqueeze(-1), model.embedding.weight[0].detach(), emb)


@pytest.mark.parametrize("reduction", ["l2", "abs_sum"])
def test_gradient_matches_saliency(model64, batch16, target16, reduction):
    forward, args = _forward_over_embeddings(model64, batch16)
    grads = Saliency(forward).attribute(
        _embeddings(model64, batch16), target=target16, abs=False, additional_forward_args=args
    )
    expected = grads.norm(dim=-1) if reduction == "l2" else grads.abs().sum(-1)
    _close(attribute(model64, batch16, "gradient", reduction=reduction), expected)


def test_grad_x_input_matches_input_x_gradient(model64, batch16, target16):
    forward, args = _forward_over_embeddings(model64, batch16)
    expected = (
        InputXGradient(forward)
        .attribute(_embeddings(model64, batch16), target=target16, additional_forward_args=args)
        .sum(-1)
    )
    _close(attribute(model64, batch16, "grad_x_input"), expected)
    _close(attribute(model64, batch16, "grad_x_input", absolute=True), expected.abs())


@pytest.mark.filterwarnings("ignore:Integrated gradients. convergence delta")  # 12 Riemann steps are coarse
@pytest.mark.parametrize(
    "rule,captum_rule",
    [
        ("gauss_legendre", "gausslegendre"),
        ("riemann_left", "riemann_left"),
        ("riemann_right", "riemann_right"),
        ("riemann_middle", "riemann_middle"),
        ("riemann_trapezoid", "riemann_trapezoid"),
    ],
)
@pytest.mark.parametrize("baseline", ["zero", "pad"])
def test_integrated_gradients_matches_captum(model_padrow, batch8, rule, captum_rule, baseline):
    model, batch = model_padrow, batch8
    emb = _embeddings(model, batch)
    base = torch.zeros_like(emb) if baseline == "zero" else _pad_baseline(model, batch, emb)
    forward, args = _forward_over_embeddings(model, batch)
    with torch.no_grad():
        target = model(batch).logits.argmin(-1)  # the non-predicted class: a different target than the default
    expected, expected_delta = IntegratedGradients(forward).attribute(
        emb,
        baselines=base,
        target=target,
        n_steps=12,
        method=captum_rule,
        additional_forward_args=args,
        return_convergence_delta=True,
    )
    scores, delta = attribute(
        model,
        batch,
        "integrated_gradients",
        target=target,
        n_steps=12,
        rule=rule,
        baseline=baseline,
        internal_batch_size=20,
        return_convergence_delta=True,
    )
    _close(scores, expected.sum(-1))
    torch.testing.assert_close(delta, expected_delta, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("baseline", ["zero", "pad"])
def test_integrated_gradients_matches_layer_integrated_gradients(model_padrow, batch16, target16, baseline):
    """Captum's usual NLP recipe: LayerIntegratedGradients on the embedding layer with baseline input ids."""
    model, batch = model_padrow, batch16

    def forward(input_ids, mask):
        return model({"input_ids": input_ids, "mask": mask}).logits.softmax(-1)

    if baseline == "pad":
        baseline_ids = batch["input_ids"].masked_fill(batch["mask"], 0)
        lig = LayerIntegratedGradients(forward, model.embedding)
        expected = lig.attribute(
            batch["input_ids"],
            baselines=baseline_ids,
            target=target16,
            n_steps=16,
            additional_forward_args=(batch["mask"],),
        ).sum(-1)
    else:  # a zero embedding has no input id: IntegratedGradients on the embeddings
        fwd, args = _forward_over_embeddings(model, batch)
        emb = _embeddings(model, batch)
        expected = (
            IntegratedGradients(fwd)
            .attribute(emb, baselines=torch.zeros_like(emb), target=target16, n_steps=16, additional_forward_args=args)
            .sum(-1)
        )
    _close(attribute(model, batch, "integrated_gradients", n_steps=16, baseline=baseline), expected)


def _captum_noise(seed, stdev, shape, n_samples):
    """Exactly the noise Captum's NoiseTunnel draws after torch.manual_seed(seed), as [n, B, T, E]."""
    torch.manual_seed(seed)
    B = shape[0]
    expanded = (B * n_samples,) + tuple(shape[1:])
    noise = torch.normal(0, torch.tensor(stdev).repeat(expanded))  # float32, as Captum draws it
    return noise.double().view(B, n_samples, *shape[1:]).transpose(0, 1)


@pytest.mark.parametrize("base", ["gradient", "grad_x_input"])
def test_smooth_grad_matches_noise_tunnel(model64, batch8, base):
    model, batch = model64, batch8
    emb = _embeddings(model, batch)
    with torch.no_grad():
        target = model(batch).logits.argmax(-1)
    forward, args = _forward_over_embeddings(model, batch)
    stdev, n = 0.05, 6
    inner = Saliency(forward) if base == "gradient" else InputXGradient(forward)
    torch.manual_seed(7)
    extra = {"abs": True} if base == "gradient" else {}
    expected = (
        NoiseTunnel(inner)
        .attribute(
            emb, nt_type="smoothgrad", nt_samples=n, stdevs=stdev, target=target, additional_forward_args=args, **extra
        )
        .sum(-1)
    )
    noise = _captum_noise(7, stdev, emb.shape, n)
    options = {"reduction": "abs_sum"} if base == "gradient" else {}
    actual = attribute(model, batch, "smooth_grad", base_method=base, n_samples=n, noise=noise, **options)
    _close(actual, expected)


@pytest.mark.parametrize("signed", [True, False])
def test_leave_one_out_pad_matches_feature_ablation(model_padrow, batch16, target16, signed):
    model, batch = model_padrow, batch16
    emb = _embeddings(model, batch)
    B, T, E = emb.shape
    forward, args = _forward_over_embeddings(model, batch)
    feature_mask = torch.arange(T).view(1, T, 1).expand(B, T, E)
    expected = FeatureAblation(forward).attribute(
        emb,
        baselines=_pad_baseline(model, batch, emb),
        target=target16,
        feature_mask=feature_mask,
        perturbations_per_eval=4,
        additional_forward_args=args,
    )[..., 0]
    expected = expected if signed else expected.abs()
    _close(attribute(model, batch, "leave_one_out", mode="pad", signed=signed, internal_batch_size=37), expected)


def test_captum_objects_are_accepted(model64, batch16, target16):
    """method=<Captum object>: our forward over embeddings replaces its own, and its user's is restored."""

    def user_forward(x):
        raise AssertionError("the object's own forward function must not be called")

    saliency = Saliency(user_forward)
    ours = attribute(model64, batch16, saliency, abs=False, reduction="abs_sum")
    assert saliency.forward_func is user_forward
    _close(ours, attribute(model64, batch16, "gradient", reduction="abs_sum"))
    ig = IntegratedGradients(user_forward)
    scores, delta = attribute(model64, batch16, ig, n_steps=10, return_convergence_delta=True)
    _close(scores, attribute(model64, batch16, "integrated_gradients", n_steps=10))
    assert delta.shape == (16,)
    tunnel = NoiseTunnel(InputXGradient(user_forward))
    torch.manual_seed(3)
    smoothed = attribute(model64, batch16, tunnel, nt_type="smoothgrad", nt_samples=3, stdevs=0.01)
    assert smoothed.shape == (16, batch16["mask"].shape[1])
    assert tunnel.forward_func is user_forward and tunnel.attribution_method.forward_func is user_forward
    with pytest.raises(TypeError, match="IntegratedGradients instead of"):
        attribute(model64, batch16, LayerIntegratedGradients(user_forward, model64.embedding))
    with pytest.raises(ValueError, match="create_graph"):
        attribute(model64, batch16, saliency, create_graph=True)

"""attribute(): leave-one-out vs a hand loop, IG completeness and adaptive steps, create_graph, inference mode,
mode/grad restoration, SmoothGrad noise, and clear errors. Oracles are direct computations on the real model."""

from __future__ import annotations

import copy
import warnings

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from lightning_xai.adapters import ProtocolError
from lightning_xai.attribution import (
    ATTRIBUTION_METHODS,
    attribute,
    explanation_context,
    occlusion_batch,
    predicted_class,
    register_method,
    remove_tokens,
    target_probabilities,
)
from lightning_xai.models import AttentionClassifier

METHODS = ["attention", "gradient", "grad_x_input", "integrated_gradients", "smooth_grad", "leave_one_out"]
FAST = {"integrated_gradients": {"n_steps": 8}, "smooth_grad": {"n_samples": 3}}


def _prob(model, batch, target):
    with torch.no_grad():
        return model(batch).logits.softmax(-1)[0, target].item()


def _with_specials(batch, sos: int = 2, eos: int = 3):
    """The batch re-encoded as <sos> w1 .. wL <eos>: specials are read (input_mask) but not real tokens (mask);
    adds impermissible/rationale masks, so deletions must move every per-token key together."""
    lengths = batch["mask"].sum(1)
    B, T = batch["mask"].shape
    ids = torch.zeros(B, T + 2, dtype=torch.long)
    mask = torch.zeros(B, T + 2, dtype=torch.bool)
    input_mask = torch.zeros(B, T + 2, dtype=torch.bool)
    for b, L in enumerate(lengths.tolist()):
        ids[b, 0], ids[b, 1 : L + 1], ids[b, L + 1] = sos, batch["input_ids"][b, :L], eos
        mask[b, 1 : L + 1] = True
        input_mask[b, : L + 2] = True
    impermissible = mask & (ids % 3 == 0)
    return {
        "input_ids": ids,
        "mask": mask,
        "input_mask": input_mask,
        "impermissible": impermissible,
        "rationale": mask & ~impermissible,
        "labels": batch["labels"],
        "index": batch["index"],
    }


def _single(batch, b):
    return {k: v[b : b + 1] for k, v in batch.items()}


# --- leave-one-out -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("specials", [False, True])
def test_leave_one_out_delete_matches_hand_loop(model64, batch8, specials):
    batch = _with_specials(batch8) if specials else batch8
    scores = attribute(model64, batch, "leave_one_out", signed=True, internal_batch_size=13)
    target = predicted_class(model64, batch)
    for b in range(batch["mask"].shape[0]):
        row = _single(batch, b)
        L = int(row["input_mask" if specials else "mask"].sum())
        ids = row["input_ids"][0, :L].tolist()
        p = _prob(model64, row, target[b])
        for i in (i for i in range(L) if row["mask"][0, i]):
            kept = ids[:i] + ids[i + 1 :]
            hand = {"input_ids": torch.tensor([kept]), "mask": row["mask"][:, :L][:, [j for j in range(L) if j != i]]}
            if specials:
                hand["input_mask"] = torch.ones(1, L - 1, dtype=torch.bool)
            expected = p - _prob(model64, hand, target[b])
            assert scores[b, i].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert (scores[~batch["mask"]] == 0).all()
    unsigned = attribute(model64, batch, "leave_one_out")
    torch.testing.assert_close(unsigned, scores.abs())


def test_occlusion_batch_moves_every_per_token_key(batch8):
    batch = _with_specials(batch8)
    rows, positions = batch["mask"].nonzero(as_tuple=True)
    variants = occlusion_batch(batch, rows, positions, 8)
    assert variants["input_ids"].shape == (rows.numel(), batch["input_ids"].shape[1] - 1)
    for k in range(rows.numel()):
        b, i = rows[k].item(), positions[k].item()
        keep = [j for j in range(batch["mask"].shape[1]) if j != i]
        for key in ("input_ids", "mask", "input_mask", "impermissible", "rationale"):
            assert variants[key][k].tolist() == batch[key][b, keep].tolist()
        assert variants["labels"][k] == batch["labels"][b] and variants["index"][k] == batch["index"][b]
    assert (variants["mask"].sum(1) == batch["mask"].sum(1)[rows] - 1).all()
    removed = remove_tokens(batch, batch["impermissible"])
    assert (removed["impermissible"].sum() == 0) and removed["mask"].sum() == (
        batch["mask"] & ~batch["impermissible"]
    ).sum()


def test_leave_one_out_single_token_row_falls_back_to_pad_with_warning(model64, batch8):
    batch = {k: v.clone() for k, v in batch8.items()}
    batch["mask"][0, 1:] = False
    batch["input_ids"][0, 1:] = 0
    with pytest.warns(RuntimeWarning, match="single real token"):
        scores = attribute(model64, batch, "leave_one_out", signed=True)
    pad = attribute(model64, batch, "leave_one_out", mode="pad", signed=True)
    assert scores[0, 0].item() == pytest.approx(pad[0, 0].item(), abs=1e-12) and scores[0, 0] != 0


# --- integrated gradients --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ig300(model64, batch8):
    """The 300-step Gauss-Legendre reference and its convergence delta (no warning may fire)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return attribute(model64, batch8, "integrated_gradients", n_steps=300, return_convergence_delta=True)


def _gap(model, batch):
    """F(x) - F(x') by hand: predicted-class probability at the embeddings minus at the zero baseline."""
    with torch.no_grad():
        logits = model(batch).logits
        target = logits.argmax(-1)[:, None]
        zero = torch.zeros_like(model.embed(batch))
        baseline = model.forward_from_embeddings(zero, batch).logits
        return logits.softmax(-1).gather(1, target)[:, 0] - baseline.softmax(-1).gather(1, target)[:, 0]


@pytest.mark.parametrize("rule", ["gauss_legendre", "riemann_trapezoid"])
def test_integrated_gradients_completeness_at_300_steps(model64, batch8, ig300, rule):
    if rule == "gauss_legendre":
        scores, delta = ig300
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            scores, delta = attribute(
                model64, batch8, "integrated_gradients", n_steps=300, rule=rule, return_convergence_delta=True
            )
    gap = _gap(model64, batch8)
    torch.testing.assert_close(delta, scores.sum(1) - gap, rtol=0, atol=1e-12)
    assert (delta.abs() <= 0.01 * gap.abs()).all(), (delta / gap).abs().max()


def test_integrated_gradients_auto_reaches_rtol_and_refines_only_missing_rows(model64, batch8, ig300):
    reference = ig300[0]
    gap = _gap(model64, batch8)
    for rtol, atol, start in ((1e-2, 1e-6, 6), (1e-9, 1e-13, 2)):
        scores, delta, steps = attribute(
            model64,
            batch8,
            "integrated_gradients",
            n_steps="auto",
            rtol=rtol,
            atol=atol,
            start_steps=start,
            return_convergence_delta=True,
            return_n_steps=True,
        )
        torch.testing.assert_close(delta, scores.sum(1) - gap, rtol=0, atol=1e-12)
        assert (delta.abs() <= torch.clamp(rtol * gap.abs(), min=atol)).all()
        assert steps.min() >= start and steps.max() <= 256
        torch.testing.assert_close(scores, reference, rtol=0, atol=0.02 * reference.abs().max().item())
    # the tight tolerance needs more steps for some rows, but not for all rows alike
    assert steps.max() > 2 and steps.unique().numel() > 1, steps
    # each row's result is the fixed-step result at the step count it was given
    for n in steps.unique().tolist():
        rows = (steps == n).nonzero().flatten()
        fixed = attribute(model64, batch8, "integrated_gradients", n_steps=n)
        torch.testing.assert_close(scores[rows], fixed[rows], rtol=1e-9, atol=1e-13)


def test_integrated_gradients_chunking_does_not_change_results(model64, batch8):
    runs = [
        attribute(model64, batch8, "integrated_gradients", n_steps=10, internal_batch_size=size)
        for size in (1, 7, 8, 80, "auto")
    ]
    for other in runs[1:]:
        torch.testing.assert_close(other, runs[0], rtol=1e-10, atol=1e-13)


def test_integrated_gradients_warns_when_delta_exceeds_five_percent(model64, batch16):
    with pytest.warns(RuntimeWarning, match="convergence delta exceeds 5%"):
        attribute(model64, batch16, "integrated_gradients", n_steps=2, rule="riemann_left")


# --- SmoothGrad ------------------------------------------------------------------------------------------------
def test_smooth_grad_noise_is_scaled_per_row_and_seeded_without_global_rng(model64, batch8):
    state = torch.get_rng_state()
    first = attribute(model64, batch8, "smooth_grad", n_samples=4, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(attribute(model64, batch8, "smooth_grad", n_samples=4, seed=5), first)
    assert not torch.allclose(attribute(model64, batch8, "smooth_grad", n_samples=4, seed=6), first)
    # oracle: σ_b = 0.15 (max - min) of row b's real-token embeddings, one N(0, 1) draw of [B, T, E] per sample
    emb = model64.embed(batch8).detach()
    real = batch8["mask"].unsqueeze(-1)
    sigma = 0.15 * (emb.masked_fill(~real, -1e9).amax((1, 2)) - emb.masked_fill(~real, 1e9).amin((1, 2)))
    g = torch.Generator().manual_seed(5)
    noise = torch.stack([torch.randn(emb.shape, generator=g, dtype=emb.dtype) for _ in range(4)]) * sigma.view(
        1, -1, 1, 1
    )
    torch.testing.assert_close(attribute(model64, batch8, "smooth_grad", n_samples=4, noise=noise), first)
    assert not torch.allclose(first, attribute(model64, batch8, "gradient"))  # the noise matters
    generator = torch.Generator().manual_seed(5)
    torch.testing.assert_close(attribute(model64, batch8, "smooth_grad", n_samples=4, generator=generator), first)
    # grouping samples into passes does not change the noise
    torch.testing.assert_close(
        attribute(model64, batch8, "smooth_grad", n_samples=4, seed=5, internal_batch_size=8), first
    )


def test_smooth_grad_over_integrated_gradients(model64, batch8):
    scores = attribute(
        model64, batch8, "smooth_grad", base_method="integrated_gradients", n_samples=2, n_steps=6, stdev=1e-12
    )
    torch.testing.assert_close(
        scores, attribute(model64, batch8, "integrated_gradients", n_steps=6), rtol=1e-6, atol=1e-9
    )


# --- create_graph ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_create_graph_gives_differentiable_maps_equal_to_detached_ones(model64, batch8, method):
    model = copy.deepcopy(model64)
    options = FAST.get(method, {})
    detached = attribute(model, batch8, method, **options)
    assert detached.grad_fn is None
    scores = attribute(model, batch8, method, create_graph=True, **options)
    assert scores.grad_fn is not None
    torch.testing.assert_close(scores.detach(), detached, rtol=1e-9, atol=1e-12)
    scores.pow(2).sum().backward()
    assert model.attention.proj.weight.grad is not None and model.attention.proj.weight.grad.abs().sum() > 0
    if method != "attention":
        assert model.classifier.weight.grad.abs().sum() > 0 and model.embedding.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("method", ["gradient", "grad_x_input", "integrated_gradients"])
def test_create_graph_passes_gradcheck(method):
    torch.manual_seed(0)
    model = AttentionClassifier(12, 2, embedding_dim=3, hidden_dim=2).double().eval()
    batch = {"input_ids": torch.tensor([[4, 5, 6], [7, 8, 0]]), "mask": torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()}
    weight = model.attention.proj.weight.detach().clone().requires_grad_()
    del model.attention.proj.weight

    def scores(w):
        model.attention.proj.weight = w
        return attribute(model, batch, method, create_graph=True, **FAST.get(method, {}))

    assert torch.autograd.gradcheck(scores, (weight,), eps=1e-6, atol=1e-6)


# --- inference mode, modes, grads -----------------------------------------------------------------------------
def test_inference_mode_caller_and_model_state_restored(model64, batch8):
    model = copy.deepcopy(model64).train()
    model.attention.eval()  # a mixed state must come back exactly
    model.classifier.bias.requires_grad_(False)
    existing = torch.ones_like(model.classifier.weight)
    model.classifier.weight.grad = existing
    modes = {name: m.training for name, m in model.named_modules()}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    expected = {m: attribute(model64, batch8, m, **FAST.get(m, {})) for m in METHODS}
    with torch.inference_mode():
        frozen = {k: v.clone() for k, v in batch8.items()}
        assert frozen["input_ids"].is_inference()
        for method in METHODS:
            for create_graph in (False, True):
                scores = attribute(model, frozen, method, create_graph=create_graph, **FAST.get(method, {}))
                assert not scores.is_inference() and (scores.grad_fn is not None) == create_graph
                torch.testing.assert_close(scores.detach(), expected[method], rtol=1e-9, atol=1e-12)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags
    assert model.classifier.weight.grad is existing
    assert all(p.grad is None for name, p in model.named_parameters() if name != "classifier.weight")


def test_context_restores_state_after_an_error(model64):
    model = copy.deepcopy(model64).train()
    with pytest.raises(RuntimeError, match="boom"):
        with explanation_context(model, freeze_parameters=True):
            assert not model.training and not any(p.requires_grad for p in model.parameters())
            raise RuntimeError("boom")
    assert model.training and all(p.requires_grad for p in model.parameters())


class _AttributeInValidation(pl.Callback):
    def __init__(self):
        self.maps = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        assert torch.is_inference_mode_enabled()
        self.maps.append(attribute(pl_module, batch, "integrated_gradients", n_steps=4))


def test_attribute_inside_trainer_validate(trained_model, batch16, tmp_path):
    model = copy.deepcopy(trained_model)
    callback = _AttributeInValidation()
    trainer = pl.Trainer(
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.validate(model, torch.utils.data.DataLoader([batch16], batch_size=None), verbose=False)
    assert len(callback.maps) == 1
    torch.testing.assert_close(callback.maps[0], attribute(model, batch16, "integrated_gradients", n_steps=4))
    assert all(p.grad is None for p in model.parameters())


# --- outputs -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_pads_are_zero_and_values_raw(model64, batch16, method):
    scores = attribute(model64, batch16, method, **FAST.get(method, {}))
    assert scores.dtype == torch.float64 and scores.shape == batch16["mask"].shape
    assert (scores[~batch16["mask"]] == 0).all()
    assert (scores[batch16["mask"]] != 0).any()
    normalized = attribute(model64, batch16, method, normalize="l1", **FAST.get(method, {}))
    torch.testing.assert_close(normalized.abs().sum(1), torch.ones(16, dtype=torch.float64))
    if method != "attention":  # attention is a distribution by construction; the others are raw
        assert not torch.allclose(scores.abs().sum(1), torch.ones(16, dtype=torch.float64))


def test_float32_model_and_explicit_targets(trained_model, batch16):
    model = copy.deepcopy(trained_model).float().eval()
    other = 1 - predicted_class(model, batch16)
    for method in METHODS:
        scores = attribute(model, batch16, method, target=other, **FAST.get(method, {}))
        assert scores.dtype == torch.float32 and torch.isfinite(scores).all()
    # probabilities of the two classes are complementary, so their gradients are opposite
    torch.testing.assert_close(
        attribute(model, batch16, "grad_x_input", target=0),
        -attribute(model, batch16, "grad_x_input", target=torch.ones(16, dtype=torch.long)),
        rtol=1e-4,
        atol=1e-6,
    )
    p = target_probabilities(model, batch16, other)
    q = target_probabilities(model, batch16)
    torch.testing.assert_close(p + q, torch.ones(16))


def test_registry_accepts_plugins(model64, batch8):
    @register_method("first_token")
    def first_token(model, batch, target, *, create_graph=False, weight=1.0):
        assert target.dtype == torch.long and target.shape == (8,)
        scores = torch.zeros(model.token_mask(batch).shape, dtype=torch.float64)
        scores[:, 0] = weight
        return scores

    try:
        assert attribute(model64, batch8, "first_token", weight=2.0)[:, 0].eq(2.0).all()
        with pytest.raises(TypeError, match=r"accepts \['weight'\]"):
            attribute(model64, batch8, "first_token", wieght=2.0)
    finally:
        del ATTRIBUTION_METHODS["first_token"]
    assert "lrp" in ATTRIBUTION_METHODS or not __import__("importlib").util.find_spec("lightning_xai.attribution.lrp")


# --- bad input -----------------------------------------------------------------------------------------------
def test_bad_inputs_give_clear_errors(model64, batch8):
    with pytest.raises(ValueError, match=r"Unknown attribution method 'saliency'; known methods: \[.*'gradient'"):
        attribute(model64, batch8, "saliency")
    with pytest.raises(ValueError, match="target 2 is out of range for a model with 2 classes"):
        attribute(model64, batch8, "gradient", target=2)
    with pytest.raises(ValueError, match=r"target values \[-1, 5\] are out of range"):
        attribute(model64, batch8, "integrated_gradients", target=torch.tensor([0, 1, 5, 0, 0, -1, 0, 0]))
    with pytest.raises(ValueError, match=r"expected \(8,\)"):
        attribute(model64, batch8, "leave_one_out", target=torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="integer tensor"):
        attribute(model64, batch8, "grad_x_input", target=torch.zeros(8))
    with pytest.raises(ProtocolError, match="does not implement the ExplainableModel protocol"):
        attribute(nn.Linear(3, 2), batch8)
    empty = {k: v.clone() for k, v in batch8.items()}
    empty["mask"][3] = False
    with pytest.raises(ValueError, match=r"rows \[3\] have no real token"):
        attribute(model64, empty, "gradient")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['n_step'\]"):
        attribute(model64, batch8, "integrated_gradients", n_step=5)
    for method, options, message in [
        ("integrated_gradients", {"rule": "simpson"}, "Unknown IG rule"),
        ("integrated_gradients", {"baseline": "mean"}, "Unknown baseline"),
        ("integrated_gradients", {"n_steps": 0}, "n_steps must be a positive int"),
        ("gradient", {"reduction": "l1"}, "Unknown reduction"),
        ("grad_x_input", {"output": "prob"}, "Unknown output"),
        ("leave_one_out", {"mode": "zero"}, "Unknown leave_one_out mode"),
        ("smooth_grad", {"base_method": "leave_one_out"}, "Unknown base_method"),
        ("integrated_gradients", {"internal_batch_size": 0}, "internal_batch_size must be a positive int"),
    ]:
        with pytest.raises(ValueError, match=message):
            attribute(model64, batch8, method, **options)
    with pytest.raises(TypeError, match=r"smooth_grad got unknown option\(s\) \['n_sample'\]"):
        attribute(model64, batch8, "smooth_grad", n_sample=3)
    with pytest.raises(ValueError, match="Unknown normalize"):
        attribute(model64, batch8, "gradient", normalize="softmax")
    with pytest.raises(TypeError, match="attribution object"):
        attribute(model64, batch8, 3)


def test_captum_is_not_imported_by_the_package():
    import subprocess
    import sys

    code = "import sys, lightning_xai.attribution; assert 'captum' not in sys.modules, 'captum imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_works_under_no_grad_like_fit_validation(model64, batch8):
    expected = attribute(model64, batch8, "grad_x_input")
    with torch.no_grad():
        scores = attribute(model64, batch8, "grad_x_input")
        graph = attribute(model64, batch8, "grad_x_input", create_graph=True)
    torch.testing.assert_close(scores, expected)
    assert graph.grad_fn is not None


def test_detach_attention_is_jain_wallace_gradient(trained_model, sst2_batch):
    """detach_attention=True equals differentiating with the attention fed back as a constant, by hand."""
    import copy

    from lightning_xai.attribution import attribute

    model = copy.deepcopy(trained_model).double()
    ours = attribute(model, sst2_batch, "grad_x_input", absolute=True, detach_attention=True)
    emb = model.embed(sst2_batch).detach().requires_grad_(True)
    with torch.no_grad():
        alpha = model.forward_from_embeddings(emb, sst2_batch).attention
    probs = model.forward_from_embeddings(emb, sst2_batch, attention_override=alpha).logits.softmax(-1)
    predicted = probs.argmax(-1)
    (grad,) = torch.autograd.grad(probs.gather(1, predicted[:, None]).sum(), emb)
    expected = (grad * emb).sum(-1).abs() * sst2_batch["mask"]
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    attached = attribute(model, sst2_batch, "grad_x_input", absolute=True)
    assert not torch.allclose(ours, attached)  # the attention path does carry gradient in a trained model

"""Adaptive integrated gradients (n_steps="auto"): the G7/K15 pair, per-token accuracy vs a 300-node reference,
reported step counts, rows refined independently, the stopping rule's limits and its errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from lightning_xai.attribution import attribute
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.attribution.quadrature import gauss_kronrod_nodes


# --- the quadrature pair ---------------------------------------------------------------------------------------
def test_gauss_kronrod_pair_nests_gauss_legendre_and_has_the_right_degrees():
    alphas, kronrod, gauss = gauss_kronrod_nodes()
    # the Gauss half is numpy's 7-node Gauss-Legendre rule on [0, 1] at the odd Kronrod nodes
    x, w = np.polynomial.legendre.leggauss(7)
    np.testing.assert_allclose(alphas[1::2], 0.5 * (x + 1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(gauss[1::2], 0.5 * w, rtol=0, atol=1e-15)
    assert (gauss[::2] == 0).all() and (np.diff(alphas) > 0).all() and (kronrod > 0).all()
    # on [-1, 1]: K15 integrates every monomial up to degree 22 exactly (odd ones by symmetry), not x^24;
    # G7 up to degree 13, not x^14
    t = 2 * alphas - 1
    for degree in range(27):
        exact = (1 + (-1) ** degree) / (degree + 1)
        k_err = abs(float(2 * kronrod @ t**degree) - exact)
        g_err = abs(float(2 * gauss @ t**degree) - exact)
        assert (k_err < 1e-14) == (degree <= 22 or degree % 2 == 1), (degree, k_err)
        assert (g_err < 1e-14) == (degree <= 13 or degree % 2 == 1), (degree, g_err)
    # and a random degree-22 polynomial on [0, 1]
    coef = np.random.default_rng(0).normal(size=23)
    exact = float(sum(c / (k + 1) for k, c in enumerate(coef)))
    assert abs(float(kronrod @ np.polynomial.polynomial.polyval(alphas, coef)) - exact) < 1e-13


# --- on the trained reference model (float64) ------------------------------------------------------------------
# The fixture model is smooth along the zero-baseline path (15 nodes reach ~1e-10), so the tests that need rows
# to refine use a far baseline, -8 x the embeddings: a 9x longer path through the LSTM's nonlinearities.
def _baseline(model, batch, scale):
    return "zero" if scale == 0 else scale * model.embed(batch).detach()


@pytest.fixture(scope="module")
def reference16(model64, batch16):
    """The 300-node Gauss-Legendre maps of 16 real SST-2 sentences, for baseline scales 0 and -8."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return {
            scale: attribute(
                model64, batch16, "integrated_gradients", n_steps=300, baseline=_baseline(model64, batch16, scale)
            )
            for scale in (0, -8)
        }


def _gap(model, batch, scale):
    """F(x) - F(x') by hand (predicted-class probability), baseline x' = scale * x on real tokens."""
    with torch.no_grad():
        emb = model.embed(batch)
        logits = model.forward_from_embeddings(emb, batch).logits
        target = logits.argmax(-1, keepdim=True)
        real = batch["mask"].unsqueeze(-1)
        base = model.forward_from_embeddings(torch.where(real, scale * emb, emb), batch).logits
        return (logits.softmax(-1).gather(1, target) - base.softmax(-1).gather(1, target))[:, 0]


@pytest.mark.parametrize("scale,token_rtol", [(0, 1e-2), (0, 1e-4), (-8, 1e-4), (-8, 1e-8)])
def test_auto_is_within_the_token_tolerance_of_300_nodes_and_meets_completeness(
    model64, batch16, reference16, scale, token_rtol
):
    reference = reference16[scale]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores, delta, steps = attribute(
            model64,
            batch16,
            "integrated_gradients",
            n_steps="auto",
            rtol=0.01,
            token_rtol=token_rtol,
            token_atol=0.0,
            baseline=_baseline(model64, batch16, scale),
            return_convergence_delta=True,
            return_n_steps=True,
        )
    mask = batch16["mask"]
    gap = _gap(model64, batch16, scale)
    torch.testing.assert_close(delta, scores.sum(1) - gap, rtol=0, atol=1e-12)
    assert (delta.abs() <= 0.01 * gap.abs()).all()
    assert (scores[~mask] == 0).all()
    # every token within token_rtol of the row's L1 mass (the reference is exact to ~1e-15 here)
    error = (scores - reference).abs().amax(1)
    bound = token_rtol * reference.abs().sum(1)
    assert (error <= bound).all(), (error / bound).max()
    # reported counts: gradient evaluations, 15 for [0, 1] and 30 per halving
    assert steps.dtype == torch.long and steps.shape == (16,)
    assert (steps >= 15).all() and ((steps - 15) % 30 == 0).all() and (steps <= 256).all()
    if scale == -8 and token_rtol == 1e-4:
        assert set(steps.tolist()) == {15, 45}, steps  # some rows refined once, others not at all


def test_auto_needs_fewer_steps_at_looser_tolerance_and_is_more_accurate_at_tighter(model64, batch16, reference16):
    base = _baseline(model64, batch16, -8)
    runs = {
        tol: attribute(
            model64,
            batch16,
            "integrated_gradients",
            n_steps="auto",
            token_rtol=tol,
            token_atol=0.0,
            baseline=base,
            return_n_steps=True,
        )
        for tol in (1e-2, 1e-4, 1e-8)
    }
    steps = [runs[tol][1] for tol in (1e-2, 1e-4, 1e-8)]
    errors = [(runs[tol][0] - reference16[-8]).abs().max() for tol in (1e-2, 1e-4, 1e-8)]
    assert (steps[0] <= steps[1]).all() and (steps[1] <= steps[2]).all() and steps[2].sum() > steps[0].sum()
    assert errors[2] < errors[1] < errors[0], errors
    assert steps[2].max() >= 75 and steps[2].unique().numel() > 1, steps[2]


def test_auto_refines_rows_independently(model64, batch16):
    base = _baseline(model64, batch16, -8)
    options = dict(n_steps="auto", token_rtol=1e-4, token_atol=0.0, return_n_steps=True)
    scores, steps = attribute(model64, batch16, "integrated_gradients", baseline=base, **options)
    assert steps.unique().numel() > 1
    # any subset of rows, in any order, gets the same map and the same step counts as in the full batch
    rows = torch.tensor([12, 2, 7, 0])
    assert steps[rows].unique().numel() > 1
    sub_scores, sub_steps = attribute(
        model64, gather_rows(batch16, rows, 16), "integrated_gradients", baseline=base[rows], **options
    )
    torch.testing.assert_close(sub_scores, scores[rows], rtol=1e-9, atol=1e-12)
    assert torch.equal(sub_steps, steps[rows])
    # one row alone likewise
    one_scores, one_steps = attribute(
        model64, gather_rows(batch16, rows[:1], 16), "integrated_gradients", baseline=base[rows[:1]], **options
    )
    torch.testing.assert_close(one_scores[0], scores[12], rtol=1e-9, atol=1e-12)
    assert int(one_steps[0]) == int(steps[12])


def test_auto_chunking_and_create_graph_do_not_change_results(model64, batch16):
    base = attribute(model64, batch16, "integrated_gradients", n_steps="auto", token_rtol=1e-5)
    for size in (7, "auto"):
        other = attribute(
            model64, batch16, "integrated_gradients", n_steps="auto", token_rtol=1e-5, internal_batch_size=size
        )
        torch.testing.assert_close(other, base, rtol=1e-9, atol=1e-12)
    graph = attribute(model64, batch16, "integrated_gradients", n_steps="auto", token_rtol=1e-5, create_graph=True)
    assert graph.requires_grad
    torch.testing.assert_close(graph.detach(), base, rtol=1e-9, atol=1e-12)
    weight = model64.classifier.weight
    (g,) = torch.autograd.grad(graph.sum(), weight)
    assert torch.isfinite(g).all() and g.abs().sum() > 0


def test_auto_warns_when_max_steps_stops_it_and_rejects_bad_options(model64, batch16):
    with pytest.warns(RuntimeWarning, match="missed the token tolerance"):
        _, steps = attribute(
            model64,
            batch16,
            "integrated_gradients",
            n_steps="auto",
            token_rtol=1e-12,
            token_atol=0.0,
            max_steps=15,
            return_n_steps=True,
        )
    assert (steps == 15).all()
    for options, message in (
        ({"token_rtol": 0.0}, "token_rtol must lie in"),
        ({"token_rtol": 0.5, "token_atol": -1.0}, "token_atol be >= 0"),
        ({"max_steps": 10}, "max_steps must be an int >= 15"),
        ({"rtol": 1.5}, "rtol must lie in"),
    ):
        with pytest.raises(ValueError, match=message):
            attribute(model64, batch16, "integrated_gradients", n_steps="auto", **options)


def test_auto_stops_on_non_finite_rows_and_leaves_the_others_alone(model64, batch16):
    base = torch.zeros_like(model64.embed(batch16)).detach()
    base[3, 0, 0] = float("nan")  # row 3's path is NaN everywhere; the error estimate cannot be trusted
    with pytest.warns(RuntimeWarning, match="1 of 16 rows missed"):
        scores, steps = attribute(
            model64, batch16, "integrated_gradients", n_steps="auto", baseline=base, return_n_steps=True
        )
    assert int(steps[3]) == 15 and torch.isnan(scores[3, 0])
    others = torch.arange(16) != 3
    torch.testing.assert_close(
        scores[others],
        attribute(model64, batch16, "integrated_gradients", n_steps="auto")[others],
        rtol=1e-9,
        atol=1e-12,
    )

"""Integrated Hessians: against finite differences of Integrated Gradients (a hand loop, tiny model), completeness
Σ_t Γ_st = IG_s within 1% on the trained model and real SST-2 sentences, symmetry, and the attribute() form."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_xai.attribution import ATTRIBUTION_METHODS, attribute, explanation_context
from lightning_xai.attribution.integrated_gradients import integrated_gradients_map
from lightning_xai.attribution.interactions import integrated_hessians
from lightning_xai.attribution.quadrature import ig_nodes
from lightning_xai.models import AttentionClassifier


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = AttentionClassifier(vocab_size=30, num_classes=2, embedding_dim=5, hidden_dim=3).double().eval()
    with torch.no_grad():
        model.embedding.weight.mul_(0.7)
    batch = {
        "input_ids": torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0]]),
        "mask": torch.tensor([[True, True, True, True], [True, True, True, False]]),
    }
    return model, batch


def _ig(model, batch, z, target, n):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return integrated_gradients_map(model, batch, z, target, n_steps=n, baseline="zero")[0]


def test_registered_with_the_plugins():
    assert "integrated_hessians" in ATTRIBUTION_METHODS


def test_matches_finite_differences_of_integrated_gradients(tiny):
    """Γ_st = Σ_k w_k · d/dh IG_s(z_k + h·δ_t) at h = 0, δ_t = x − x′ on token t only, by central differences."""
    model, batch = tiny
    n, h = 6, 1e-5
    target = torch.tensor([1, 0])
    gamma = integrated_hessians(model, batch, target, n_steps=n)
    with explanation_context(model):
        x = model.embed(batch).detach()
        mask = batch["mask"]
        delta = x * mask.unsqueeze(-1)  # baseline zero on real tokens
        expected = torch.zeros(2, 4, 4, dtype=x.dtype)
        alphas, weights = ig_nodes(n)
        for alpha, weight in zip(alphas.tolist(), weights.tolist()):
            z = x - delta + alpha * delta
            for t in range(4):
                step = torch.zeros_like(x)
                step[:, t] = delta[:, t]
                up, down = _ig(model, batch, z + h * step, target, n), _ig(model, batch, z - h * step, target, n)
                diff = (up - down) / (2 * h)
                expected[:, :, t] += weight * diff
    expected = expected * mask.unsqueeze(2) * mask.unsqueeze(1)
    assert expected.abs().max() > 1e-3  # the model has interactions to find
    torch.testing.assert_close(gamma, expected, rtol=1e-5, atol=1e-8)


def test_off_diagonal_is_symmetric(tiny):
    model, batch = tiny
    gamma = integrated_hessians(model, batch, n_steps=6)
    off = ~torch.eye(4, dtype=torch.bool)
    torch.testing.assert_close(gamma[:, off], gamma.transpose(1, 2)[:, off], rtol=1e-9, atol=1e-12)
    assert gamma[1, 3].abs().sum() == 0 and gamma[1, :, 3].abs().sum() == 0  # the pad's row and column


def test_completeness_against_integrated_gradients_on_real_sentences(model64, batch8):
    sub = {k: v[:4] for k, v in batch8.items()}
    gamma, delta = integrated_hessians(model64, sub, n_steps=12, return_convergence_delta=True)
    ig = attribute(model64, sub, "integrated_gradients", n_steps=64)
    rows = gamma.sum(-1)
    # Σ_t Γ_st = IG_s within 1% of each row's attribution mass
    scale = ig.abs().sum(1, keepdim=True)
    assert ((rows - ig).abs() <= 0.01 * scale).all(), ((rows - ig).abs() / scale).max()
    assert (delta.abs() <= 0.01 * scale).all()
    # and interactions are not just the diagonal: the off-diagonal part carries a visible share
    off = gamma - torch.diag_embed(torch.diagonal(gamma, dim1=1, dim2=2))
    assert off.abs().sum() > 0.01 * gamma.abs().sum()


def test_attribute_returns_the_map_and_the_interactions(tiny):
    model, batch = tiny
    scores, gamma = attribute(model, batch, "integrated_hessians", n_steps=6)
    assert scores.shape == (2, 4) and gamma.shape == (2, 4, 4)
    torch.testing.assert_close(scores, gamma.sum(-1))
    torch.testing.assert_close(gamma, integrated_hessians(model, batch, n_steps=6))
    with pytest.raises(ValueError, match="create_graph"):
        attribute(model, batch, "integrated_hessians", create_graph=True)
    with pytest.raises(ValueError, match="n_steps"):
        integrated_hessians(model, batch, n_steps=0)


def test_coarse_rule_warns():
    """A sharply non-linear path (embeddings ×3 on a random tiny model) breaks completeness at one node."""
    torch.manual_seed(0)
    model = AttentionClassifier(vocab_size=30, num_classes=2, embedding_dim=5, hidden_dim=3).double().eval()
    with torch.no_grad():
        model.embedding.weight.mul_(3.0)
    batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
    with pytest.warns(RuntimeWarning, match="raise n_steps"):
        integrated_hessians(model, batch, n_steps=1, inner_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        integrated_hessians(model, batch, n_steps=16)

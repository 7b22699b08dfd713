"""Smooth attention: zero noise is the attention, explicit noise is a hand-averaged attention, the noise scale is
smooth_grad's, and the method runs inside AttentionAudit. Real SST-2 sentences, the session's trained model."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from lightning_xai.attribution import ATTRIBUTION_METHODS, attribute
from lightning_xai.attribution.smooth_attention import noise_scale, smooth_attention_map
from lightning_xai.callbacks import AttentionAudit
from lightning_xai.data import collate


def test_registered_with_the_plugins():
    assert "smooth_attention" in ATTRIBUTION_METHODS


@pytest.mark.parametrize("option", [{"noise_level": 0.0}, {"stdev": 0.0}])
def test_zero_noise_equals_attention(model64, batch16, option):
    smooth = attribute(model64, batch16, "smooth_attention", n_samples=5, **option)
    plain = attribute(model64, batch16, "attention")
    torch.testing.assert_close(smooth, plain, rtol=0, atol=1e-12)


def test_explicit_noise_is_a_hand_average(model64, batch8):
    emb = model64.embed(batch8).detach()
    mask = batch8["mask"]
    noise = torch.randn(4, *emb.shape, generator=torch.Generator().manual_seed(3), dtype=emb.dtype)
    expected = torch.zeros(mask.shape, dtype=emb.dtype)
    with torch.no_grad():
        for k in range(4):
            noisy = emb + noise[k] * mask.unsqueeze(-1)
            expected += model64.forward_from_embeddings(noisy, batch8).attention / 4
    for rows in (1, 8, 32):  # grouping samples into passes changes nothing
        got = attribute(model64, batch8, "smooth_attention", n_samples=4, noise=noise, internal_batch_size=rows)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_noise_is_seeded_and_changes_attention(model64, batch16):
    a = attribute(model64, batch16, "smooth_attention", n_samples=6, seed=1)
    b = attribute(model64, batch16, "smooth_attention", n_samples=6, seed=1)
    c = attribute(model64, batch16, "smooth_attention", n_samples=6, seed=2)
    plain = attribute(model64, batch16, "attention")
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)
    assert (a - plain).abs().max() > 1e-4
    # still a distribution over the real tokens, 0 on pads
    torch.testing.assert_close(a.sum(1), torch.ones(16, dtype=a.dtype))
    assert bool((a[~batch16["mask"]] == 0).all())


def test_noise_scale_is_smooth_grads_convention(model64, batch8):
    emb = model64.embed(batch8).detach()
    mask = batch8["mask"]
    sigma = noise_scale(emb, mask, 0.15)
    for b in range(8):
        real = emb[b][mask[b]]
        assert sigma[b].item() == pytest.approx(0.15 * (real.max() - real.min()).item(), rel=1e-12)


def test_create_graph_reaches_parameters(model64, batch8):
    smooth = attribute(model64, batch8, "smooth_attention", n_samples=3, create_graph=True)
    loss = (smooth * torch.linspace(0, 1, smooth.shape[1], dtype=smooth.dtype)).sum()
    grads = torch.autograd.grad(loss, [model64.attention.parameters().__next__()])
    assert grads[0].abs().sum() > 0


def test_bad_options_are_named(model64, batch8):
    with pytest.raises(ValueError, match="n_samples"):
        attribute(model64, batch8, "smooth_attention", n_samples=0)
    with pytest.raises(ValueError, match="noise must have shape"):
        attribute(model64, batch8, "smooth_attention", n_samples=2, noise=torch.zeros(1, 1, 1, 1))
    with pytest.raises(TypeError, match="unknown option"):
        attribute(model64, batch8, "smooth_attention", base_method="gradient")
    emb = model64.embed(batch8).detach()
    with pytest.raises(ValueError, match="noise_level"):
        smooth_attention_map(model64, batch8, emb, noise_level=-1.0)


def test_usable_in_attention_audit(trained_model, sst2, tmp_path):
    audit = AttentionAudit(
        methods=("smooth_attention", "gradient"),
        metrics=("kendall_tau",),
        method_options={"smooth_attention": {"n_samples": 4}},
        num_samples=32,
    )
    loader = torch.utils.data.DataLoader(
        torch.utils.data.Subset(sst2.dataset("val"), range(32)), batch_size=16, collate_fn=collate
    )
    trainer = pl.Trainer(
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[audit],
        default_root_dir=tmp_path,
    )
    trainer.validate(trained_model, loader)
    metrics = audit.history[-1]["metrics"]
    assert {"kendall_tau/attention_vs_smooth_attention/mean", "kendall_tau/smooth_attention_vs_gradient/mean"} <= set(
        metrics
    )
    print(metrics["kendall_tau/attention_vs_smooth_attention/mean"])
    # smoothing at σ = 0.15·range perturbs attention but keeps its ranking close to the plain one on this model
    assert 0.3 < metrics["kendall_tau/attention_vs_smooth_attention/mean"] < 1.0

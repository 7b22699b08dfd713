"""Wiegreffe & Pinter's diagnostic MLP (imposed / uniform / trained attention) and seed variance."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from torch.utils.data import DataLoader, Subset

from lightning_xai.audits.seed_variance import seed_variance
from lightning_xai.data import collate
from lightning_xai.models import AttentionClassifier
from lightning_xai.models.diagnostic import DiagnosticMLP, diagnostic_audit, evaluate_classifier


def test_imposed_attention_is_the_sources_and_the_source_is_never_trained(sst2, trained_model, sst2_batch, tmp_path):
    source = copy.deepcopy(trained_model)
    before = {k: v.clone() for k, v in source.state_dict().items()}
    train = DataLoader(Subset(sst2.dataset("train"), range(64)), batch_size=32, collate_fn=collate)
    val = DataLoader(Subset(sst2.dataset("val"), range(32)), batch_size=32, collate_fn=collate)
    results = diagnostic_audit(
        train,
        val,
        [sst2_batch],
        sst2.vocab_size,
        2,
        {"base": source},
        epochs=1,
        embedding_dim=16,
        hidden_dim=8,
        trainer_kwargs={"default_root_dir": tmp_path},
    )
    assert set(results) == {"trained", "uniform", "imposed:base"}
    assert all(0.0 <= r["acc"] <= 1.0 and r["n"] == 16 for r in results.values())
    assert all(torch.equal(before[k], v) for k, v in source.state_dict().items())
    mlp = DiagnosticMLP(sst2.vocab_size, 2, mode="imposed", attention_source=source, embedding_dim=16)
    with torch.no_grad():
        assert torch.allclose(mlp(sst2_batch).attention, source(sst2_batch).attention)
    assert not any(k.startswith("_source") for k in mlp.state_dict()) and "attention_source" not in mlp.hparams


def test_uniform_mlp_pools_with_one_over_length(sst2, sst2_batch):
    mlp = DiagnosticMLP(sst2.vocab_size, 2, mode="uniform", embedding_dim=8)
    att = mlp(sst2_batch).attention
    lengths = sst2_batch["mask"].sum(-1, keepdim=True).float()
    assert torch.allclose(att, sst2_batch["mask"].float() / lengths)
    assert isinstance(mlp.encoder, torch.nn.Module) and mlp.hparams.encoder == "mlp"


def test_bad_configuration_raises(trained_model):
    with pytest.raises(ValueError, match="attention_source"):
        DiagnosticMLP(20, 2, mode="imposed")
    with pytest.raises(ValueError, match="mode"):
        DiagnosticMLP(20, 2, mode="random")
    with pytest.raises(ValueError, match="encoder"):
        DiagnosticMLP(20, 2, encoder="bilstm")


def test_evaluate_classifier_matches_hand_count(trained_model, sst2_batch):
    with torch.no_grad():
        pred = trained_model(sst2_batch).logits.argmax(-1)
    scores = evaluate_classifier(trained_model, [sst2_batch])
    assert scores["acc"] == pytest.approx((pred == sst2_batch["labels"]).float().mean().item())


def test_seed_variance_matches_scipy(sst2, trained_model, sst2_batch):
    torch.manual_seed(1)
    other = AttentionClassifier(sst2.vocab_size, 2, embedding_dim=32, hidden_dim=16)
    result = seed_variance(trained_model, [trained_model, other], [sst2_batch])
    assert result.jsd.shape == (2, 16)
    assert torch.allclose(result.jsd[0], torch.zeros(16), atol=1e-7)
    with torch.no_grad():
        p = other(sst2_batch).attention.numpy()
        q = trained_model(sst2_batch).attention.numpy()
    expected = [jensenshannon(a, b) ** 2 for a, b in zip(p, q)]
    assert np.allclose(result.jsd[1].numpy(), expected, atol=1e-6)
    assert set(result.summary()) == {"mean_jsd", "median_jsd", "mean_tvd", "median_tvd"}
    with pytest.raises(ValueError, match="at least one"):
        seed_variance(trained_model, [], [sst2_batch])

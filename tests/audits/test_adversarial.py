"""Jain & Wallace's divergences vs scipy and the per-instance adversarial attention search."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy

from lightning_xai.audits.adversarial import (
    adversarial_attention_search,
    jensen_shannon_divergence,
    kl_divergence,
    summarize_search,
    total_variation,
)


def test_divergences_match_scipy():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(7), size=5)
    q = rng.dirichlet(np.ones(7), size=5)
    tp, tq = torch.tensor(p), torch.tensor(q)
    assert np.allclose(kl_divergence(tp, tq).numpy(), [entropy(a, b) for a, b in zip(p, q)], atol=1e-8)
    assert np.allclose(
        jensen_shannon_divergence(tp, tq).numpy(), [jensenshannon(a, b) ** 2 for a, b in zip(p, q)], atol=1e-8
    )
    assert np.allclose(total_variation(tp, tq).numpy(), 0.5 * np.abs(p - q).sum(-1))
    # zeros (pads) contribute nothing; disjoint supports reach ln 2
    assert jensen_shannon_divergence(
        torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    ).item() == pytest.approx(np.log(2), rel=1e-6)


@pytest.fixture(scope="module")
def search_result(trained_model, sst2_batch):
    model = copy.deepcopy(trained_model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = adversarial_attention_search(model, sst2_batch, steps=150, seed=0)
    return model, before, result


def test_search_respects_the_output_constraint_and_the_mask(search_result, sst2_batch):
    model, _, result = search_result
    mask = sst2_batch["mask"]
    assert result.found.float().mean() >= 0.75
    found = result.found
    att = result.attention
    assert torch.allclose(att.sum(-1), torch.ones(len(att)), atol=1e-5) and (att[~mask] == 0).all()
    # re-run the model independently with the reported attention: the output change is what was reported
    with torch.no_grad():
        probs = model(sst2_batch, attention_override=att).logits.softmax(-1)
        base = model(sst2_batch).logits.softmax(-1)
    change = 0.5 * (probs - base).abs().sum(-1)
    assert torch.allclose(change[found], result.output_change[found], atol=1e-5)
    assert (change[found] <= 0.05 + 1e-6).all()
    assert torch.allclose(
        jensen_shannon_divergence(att, result.original_attention)[found], result.max_jsd[found], atol=1e-6
    )
    assert torch.isnan(result.max_jsd[~found]).all()


def test_search_moves_attention_far_beyond_its_initialisation(search_result, sst2_batch, trained_model):
    _, _, result = search_result
    start = adversarial_attention_search(copy.deepcopy(trained_model), sst2_batch, steps=0, seed=0)
    assert result.candidate_jsd.mean() > start.candidate_jsd.mean() + 0.05
    assert np.nanmedian(result.max_jsd.numpy()) > 0.3


def test_search_leaves_the_model_untouched_and_is_deterministic(search_result, sst2_batch):
    model, before, result = search_result
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())
    model.train()
    again = adversarial_attention_search(model, sst2_batch, steps=150, seed=0)
    assert model.training
    assert torch.equal(again.candidate_jsd, result.candidate_jsd)


def test_fast_path_equals_generic_forward(trained_model, sst2_batch):
    model = copy.deepcopy(trained_model)
    fast = adversarial_attention_search(model, sst2_batch, steps=20, seed=3)
    slow = adversarial_attention_search(model, sst2_batch, steps=20, seed=3, fixed_hidden=False)
    assert torch.allclose(fast.candidate_jsd, slow.candidate_jsd, atol=1e-4)
    assert torch.allclose(fast.candidate_output_change, slow.candidate_output_change, atol=1e-4)


def test_summary_and_bad_arguments(trained_model, sst2_batch):
    s = summarize_search(torch.tensor([0.1, 0.4, float("nan"), 0.5]), threshold=0.3)
    assert s["fraction_found"] == 0.75 and s["fraction_at_least_threshold"] == 0.5
    assert s["median"] == pytest.approx(0.4)
    with pytest.raises(ValueError, match="num_candidates"):
        adversarial_attention_search(trained_model, sst2_batch, num_candidates=0)
    with pytest.raises(TypeError, match="ExplainableModel"):
        adversarial_attention_search(torch.nn.Linear(2, 2), sst2_batch)


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_a_transformer_searches_through_its_replay_with_the_full_passes_results(name):
    pytest.importorskip("transformers")
    from tests.metrics.test_decision_flip_replay import ENCODERS, _batch, _hf

    adapter = _hf(name)  # float64, eval: the replay is exact, only faster
    batch = _batch(name in ENCODERS, left=name == "llama", lengths=(9, 5, 7))
    calls = []
    first_ffn = next(m for m in adapter.model.modules() if type(m).__name__ in ("BertIntermediate", "LlamaMLP"))
    first_ffn.register_forward_hook(lambda module, args, out: calls.append(1))
    fast = adversarial_attention_search(adapter, batch, steps=15, num_candidates=3, seed=1)
    replay_calls = len(calls)
    slow = adversarial_attention_search(adapter, batch, steps=15, num_candidates=3, seed=1, fixed_hidden=False)
    assert torch.allclose(fast.candidate_jsd, slow.candidate_jsd, rtol=0, atol=1e-9)
    assert torch.allclose(fast.candidate_output_change, slow.candidate_output_change, rtol=0, atol=1e-9)
    assert replay_calls < 5 < len(calls) - replay_calls  # the replay ran the first layer for its set-up only

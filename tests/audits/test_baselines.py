"""J&W permutation test and W&P uniform attention: checked against hand loops, numpy and torchmetrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchmetrics

from lightning_xai.audits.baselines import (
    bin_by_max_attention,
    permutation_test,
    permute_attention,
    total_variation,
    uniform_attention,
    uniform_attention_evaluation,
    uniform_attention_summary,
)
from lightning_xai.models import AttentionClassifier


def test_permute_attention_permutes_real_tokens_only(sst2_batch):
    mask = sst2_batch["mask"]
    attention = torch.rand(mask.shape).masked_fill(~mask, 0.0)
    out = permute_attention(attention, mask, 7, torch.Generator().manual_seed(1))
    assert out.shape == (7, *mask.shape)
    assert torch.all(out[:, ~mask] == 0)
    for n in range(7):
        for b in range(mask.shape[0]):
            real = attention[b][mask[b]]
            assert torch.equal(out[n, b][mask[b]].sort().values, real.sort().values)
    # not the identity: most long rows change order
    changed = (out != attention.unsqueeze(0)).any(-1).float().mean()
    assert changed > 0.8


def test_permute_attention_is_uniform_over_positions():
    # 1 row, 4 real tokens + 1 pad: each value lands at each real position ~1/4 of the time.
    mask = torch.tensor([[True, True, False, True, True]])
    attention = torch.tensor([[1.0, 2.0, 0.0, 3.0, 4.0]])
    out = permute_attention(attention, mask, 4000, torch.Generator().manual_seed(0))[:, 0]
    counts = torch.stack([(out[:, [0, 1, 3, 4]] == v).float().mean(0) for v in (1.0, 2.0, 3.0, 4.0)])
    assert torch.allclose(counts, torch.full_like(counts, 0.25), atol=0.03)
    same = permute_attention(attention, mask, 5, torch.Generator().manual_seed(3))
    assert torch.equal(same, permute_attention(attention, mask, 5, torch.Generator().manual_seed(3)))


def test_permutation_test_matches_hand_loop(trained_model, sst2_batch):
    model = trained_model.eval()
    gen_state = torch.Generator().manual_seed(5)
    result = permutation_test(model, sst2_batch, num_permutations=9, generator=gen_state, chunk_size=40)
    permuted = permute_attention(
        model(sst2_batch).attention.detach(), sst2_batch["mask"], 9, torch.Generator().manual_seed(5)
    )
    with torch.no_grad():
        base = model(sst2_batch).logits.softmax(-1)
        for n in range(9):
            probs = model(sst2_batch, attention_override=permuted[n]).logits.softmax(-1)
            expected = 0.5 * (probs - base).abs().sum(-1)
            assert torch.allclose(result.deltas[n], expected, atol=1e-6)
    assert torch.allclose(
        result.median_delta, torch.from_numpy(np.median(result.deltas.numpy(), axis=0)).float(), atol=1e-7
    )
    att = model(sst2_batch).attention.detach()
    assert torch.allclose(result.max_attention, att.max(-1).values)
    # binary case: the total variation equals J&W's |p1 - p1'|
    assert torch.allclose(total_variation(base, probs), (base[:, 1] - probs[:, 1]).abs(), atol=1e-6)


def test_permutation_of_uniform_attention_changes_nothing(sst2, sst2_batch):
    torch.manual_seed(0)
    model = AttentionClassifier(sst2.vocab_size, 2, embedding_dim=16, hidden_dim=8, attention="uniform").eval()
    result = permutation_test(model, sst2_batch, num_permutations=5, generator=torch.Generator().manual_seed(0))
    assert result.deltas.abs().max() < 1e-6


def test_bin_by_max_attention_matches_numpy():
    rng = np.random.default_rng(0)
    delta, peak = rng.random(200), rng.random(200)
    bins = bin_by_max_attention(torch.from_numpy(delta), torch.from_numpy(peak), edges=(0.0, 0.3, 0.6, 1.0))
    assert bins["[0.00,0.30)"]["count"] == int(((peak >= 0) & (peak < 0.3)).sum())
    assert bins["[0.60,1.00]"]["median"] == pytest.approx(float(np.median(delta[peak >= 0.6])))
    assert sum(b["count"] for b in bins.values()) == 200
    with pytest.raises(ValueError, match="increasing"):
        bin_by_max_attention(torch.zeros(2), torch.zeros(2), edges=(0.5, 0.1))


def test_uniform_attention_evaluation_matches_manual(trained_model, sst2_batch):
    out = uniform_attention_evaluation(trained_model, sst2_batch)
    mask = sst2_batch["mask"]
    expected = mask.float() / mask.sum(-1, keepdim=True)
    assert torch.allclose(uniform_attention(mask), expected)
    with torch.no_grad():
        trained = trained_model(sst2_batch).logits.softmax(-1)
        uniform = trained_model(sst2_batch, attention_override=expected).logits.softmax(-1)
    assert torch.equal(out["uniform_pred"], uniform.argmax(-1))
    assert torch.equal(out["trained_pred"], trained.argmax(-1))
    assert torch.allclose(out["delta"], 0.5 * (trained - uniform).abs().sum(-1), atol=1e-6)
    summary = uniform_attention_summary(out["trained_pred"], out["uniform_pred"], out["labels"], num_classes=2)
    acc = torchmetrics.functional.accuracy(out["uniform_pred"], out["labels"], task="multiclass", num_classes=2)
    f1 = torchmetrics.functional.f1_score(
        out["trained_pred"], out["labels"], task="multiclass", num_classes=2, average="macro"
    )
    assert summary["accuracy_uniform"] == pytest.approx(float(acc))
    assert summary["f1_trained"] == pytest.approx(float(f1))
    assert summary["accuracy_delta"] == pytest.approx(summary["accuracy_uniform"] - summary["accuracy_trained"])


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="bool"):
        uniform_attention(torch.ones(1, 2))
    with pytest.raises(ValueError, match="no real token"):
        uniform_attention(torch.tensor([[False, False]]))
    with pytest.raises(ValueError, match="num_permutations"):
        permute_attention(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), 0)
    with pytest.raises(KeyError, match="labels"):
        uniform_attention_evaluation(
            AttentionClassifier(10, 2, embedding_dim=4, hidden_dim=2),
            {"input_ids": torch.tensor([[2, 3]]), "mask": torch.ones(1, 2, dtype=torch.bool)},
        )


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_permutations_and_uniform_attention_of_a_transformer_run_through_its_replay(name, monkeypatch):
    pytest.importorskip("transformers")
    import lightning_xai.audits.baselines as baselines
    from tests.metrics.test_decision_flip_replay import ENCODERS, _batch, _hf

    adapter = _hf(name)  # float64, eval
    batch = _batch(name in ENCODERS, left=name == "llama")
    passes = []
    last_ffn = [m for m in adapter.model.modules() if type(m).__name__ in ("BertIntermediate", "LlamaMLP")]
    for i, module in enumerate(last_ffn):
        module.register_forward_hook(lambda mod, args, out, i=i: passes.append(i))
    fast = permutation_test(adapter, batch, num_permutations=12, generator=torch.Generator().manual_seed(3))
    replayed = list(passes)
    labelled = {**batch, "labels": torch.arange(batch["input_ids"].shape[0]) % 2}
    uniform_fast = uniform_attention_evaluation(adapter, labelled)
    with torch.no_grad():  # a replay made once serves both (as AttentionBaselines does)
        shared = baselines.override_scorer(adapter, adapter.embed(batch), batch)
    again = permutation_test(
        adapter, batch, num_permutations=12, generator=torch.Generator().manual_seed(3), replay=shared
    )
    assert torch.equal(again.deltas, fast.deltas)
    assert torch.equal(uniform_attention_evaluation(adapter, labelled, replay=shared)["delta"], uniform_fast["delta"])
    monkeypatch.setattr(baselines, "override_scorer", lambda m, e, b: (m.forward_from_embeddings(e, b), None))
    slow = permutation_test(adapter, batch, num_permutations=12, generator=torch.Generator().manual_seed(3))
    uniform_slow = uniform_attention_evaluation(adapter, labelled)
    assert torch.allclose(uniform_fast["delta"], uniform_slow["delta"], rtol=0, atol=1e-6)  # float32 probabilities
    assert float(uniform_slow["delta"].max()) > 1e-4
    assert torch.allclose(fast.deltas, slow.deltas, rtol=0, atol=1e-10) and float(fast.deltas.max()) > 1e-4
    assert torch.allclose(fast.median_delta, slow.median_delta, rtol=0, atol=1e-10)
    # after the replay's set-up, the permutations ran the last layer's feed-forward only
    assert replayed.count(0) < replayed.count(len(last_ffn) - 1)

"""HuggingFaceAdapter's OverrideReplay: the scorer equals full passes with the same override; refusals."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.adapters.capabilities import OverrideReplay
from lightning_xai.adapters.huggingface.replay import layer_stack, override_replay
from lightning_xai.attribution import gather_rows

pytest.importorskip("transformers")
from tests.adapters.test_families import family_batch, family_model  # noqa: E402

CASES = [
    ("bert", False),
    ("distilbert", False),
    ("llama", True),
    ("llama", False),
    ("qwen2", True),
    ("modernbert", False),
    ("modernbert-mean", False),
    ("gpt2", True),
    ("mistral", False),
]


def _adapter(name: str) -> HuggingFaceAdapter:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HuggingFaceAdapter(family_model(name))


def _overrides(mask: torch.Tensor, rows: torch.Tensor, heads: int, seed: int = 0):
    """A [N, T] distribution over each selected row's real tokens and [N, heads, T] raw rows."""
    g = torch.Generator().manual_seed(seed)
    real = mask.index_select(0, rows)
    tokens = torch.rand(real.shape, generator=g, dtype=torch.float64).masked_fill(~real, 0.0)
    raw = torch.rand(rows.numel(), heads, mask.shape[1], generator=g, dtype=torch.float64)
    return tokens / tokens.sum(1, keepdim=True), raw / raw.sum(-1, keepdim=True)


#: the models run in float64, but rotary families (Llama, Mistral, ModernBERT, Qwen2) build their cos/sin tables in
#: float32 whatever the model's dtype (transformers' design); a replay cut to a shorter width computes those tables
#: over another shape, which on AVX2 CPUs takes another float32 kernel: 5e-9 apart was measured there
#: (ATEN_CPU_CAPABILITY=avx2), 0 on AVX-512. Far below what an override changes (> 1e-6, asserted below).
REPLAY_ATOL = 1e-7


@pytest.mark.parametrize("name,left", CASES, ids=[f"{n}-{'left' if is_left else 'right'}" for n, is_left in CASES])
def test_scorer_equals_full_passes_with_the_same_override(name, left):
    adapter = _adapter(name)
    batch = family_batch(name, left)
    assert isinstance(adapter, OverrideReplay)
    rows = torch.tensor([2, 0, 0, 1, 2])  # repeats and any order
    part = gather_rows(batch, rows, 3)
    with torch.no_grad():
        emb = adapter.embed(batch)
        out, scorer = adapter.override_replay(emb, batch)
        assert scorer is not None
        plain = adapter.forward_from_embeddings(emb, batch)
        assert torch.equal(out.logits, plain.logits) and torch.equal(out.attention, plain.attention)
        assert torch.allclose(scorer(rows, None), plain.logits[rows], rtol=0, atol=REPLAY_ATOL)
        heads = out.raw_attentions[-1].shape[1]
        tokens, raw = _overrides(adapter.token_mask(batch), rows, heads)
        for override in (tokens, raw):
            full = adapter.forward_from_embeddings(emb[rows], part, attention_override=override).logits
            fast = scorer(rows, override)
            assert torch.allclose(fast, full, rtol=0, atol=REPLAY_ATOL), (fast - full).abs().max()
            assert not torch.allclose(full, plain.logits[rows], atol=1e-6)  # the override changes the logits
        assert "forward" not in vars(layer_stack(adapter.model, adapter._attention_modules[-1])[0])  # restored


def test_scorer_runs_only_the_last_layer():
    adapter = _adapter("bert")
    batch = family_batch("bert", False)
    layers = layer_stack(adapter.model, adapter._attention_modules[-1])
    calls = []
    for i, layer in enumerate(layers):
        inner = layer.intermediate  # the feed-forward block of every BERT layer
        inner.register_forward_hook(lambda module, args, output, i=i: calls.append(i))
    with torch.no_grad():
        _, scorer = adapter.override_replay(adapter.embed(batch), batch)
        calls.clear()
        scorer(torch.tensor([0, 1]), None)
    assert calls == [len(layers) - 1]


def test_layer_stack_and_refusals():
    bert = _adapter("bert")
    assert [type(m).__name__ for m in layer_stack(bert.model, bert._attention_modules[-1])] == ["BertLayer"] * 2
    assert layer_stack(bert.model, bert._attention_modules[0]) is None  # not in the last layer
    batch = family_batch("bert", False)
    with torch.no_grad():
        bert.train()
        out, scorer = override_replay(bert, bert.embed(batch), batch)
        assert scorer is None and out.logits.shape == (3, 2)  # dropout: no replay in training mode
        bert.eval()
    albert = _adapter("albert")  # one layer module shared by every layer: nothing to replay
    with torch.no_grad():
        assert albert.override_replay(albert.embed(batch), batch)[1] is None


def test_scorer_runs_short_rows_in_narrow_passes():
    adapter = _adapter("bert")
    lengths, T = (14, 6, 3, 13), 14
    ids = torch.full((4, T), 1)
    attention_mask = torch.zeros(4, T, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(4, 64, (n,), generator=torch.Generator().manual_seed(row))
        ids[row, 0], ids[row, n - 1] = 2, 3
        attention_mask[row, :n] = 1
    mask = attention_mask.bool() & (ids != 2) & (ids != 3)
    batch = {"input_ids": ids, "attention_mask": attention_mask, "mask": mask}
    last = layer_stack(adapter.model, adapter._attention_modules[-1])[-1]
    widths = []
    last.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append((args[0] if args else kwargs["hidden_states"]).shape[1]),
        with_kwargs=True,
    )
    rows = torch.tensor([3, 2, 1, 0, 2])
    with torch.no_grad():
        emb = adapter.embed(batch)
        _, scorer = override_replay(adapter, emb, batch, pack=False)
        tokens, _ = _overrides(mask, rows, heads=4)
        widths.clear()
        fast = scorer(rows, tokens)
        assert sorted(widths) == [3, 6, 14]  # reach (W/2, W], (W/4, W/2], (W/8, W/4] of the widest row run apart
        full = adapter.forward_from_embeddings(emb[rows], gather_rows(batch, rows, 4), attention_override=tokens).logits
    assert torch.allclose(fast, full, rtol=0, atol=1e-10)

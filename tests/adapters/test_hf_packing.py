"""Packed override scoring: a row's overrides in one sequence give the full passes' logits; where it is refused."""

from __future__ import annotations

import warnings

import pytest
import torch

import lightning_xai.adapters.huggingface.packing as packing
import lightning_xai.adapters.huggingface.replay as replay
from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.adapters.huggingface.replay import layer_stack, override_replay
from lightning_xai.attribution import gather_rows

pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForSequenceClassification  # noqa: E402

from tests.adapters.test_families import PAD, SIZE, family_batch, family_model  # noqa: E402
from tests.adapters.test_hf_replay import _overrides  # noqa: E402


def _bert(max_positions: int = 64) -> HuggingFaceAdapter:
    config = AutoConfig.for_model(
        "bert",
        **{**SIZE, "max_position_embeddings": max_positions},
        num_labels=2,
        pad_token_id=PAD,
        attn_implementation="eager",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HuggingFaceAdapter(AutoModelForSequenceClassification.from_config(config).double().eval())


def _rows_of_lengths(lengths, T):
    ids = torch.full((len(lengths), T), PAD)
    attention_mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(4, 64, (n,), generator=torch.Generator().manual_seed(row))
        ids[row, 0], ids[row, n - 1] = 2, 3
        attention_mask[row, :n] = 1
    mask = attention_mask.bool() & (ids != 2) & (ids != 3)
    return {"input_ids": ids, "attention_mask": attention_mask, "mask": mask}


def _scored_shapes(adapter, batch, rows, override=None):
    """The batch's override scorer, and ``(sequences, width)`` of every last-layer pass one call of it makes."""
    shapes = []
    last = layer_stack(adapter.model, adapter._attention_modules[-1])[-1]
    handle = last.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple((args[0] if args else kwargs["hidden_states"]).shape[:2])),
        with_kwargs=True,
    )
    try:
        with torch.no_grad():
            _, scorer = adapter.override_replay(adapter.embed(batch), batch)
            shapes.clear()
            scorer(rows, override)
    finally:
        handle.remove()
    return scorer, shapes


@torch.no_grad()
def _check_against_full_passes(adapter, batch, rows, scorer):
    emb = adapter.embed(batch)
    part = gather_rows(batch, rows, batch["input_ids"].shape[0])
    heads = adapter.model.config.num_attention_heads
    for override in (*_overrides(adapter.token_mask(batch), rows, heads), None):
        full = adapter.forward_from_embeddings(emb[rows], part, attention_override=override).logits
        fast = scorer(rows, override)
        assert torch.allclose(fast, full, rtol=0, atol=1e-10), (fast - full).abs().max()


def test_a_rows_overrides_run_as_copies_of_its_pooled_query_in_one_sequence():
    adapter = _bert()
    batch = _rows_of_lengths((14, 6, 3, 13), 14)
    rows = torch.tensor([3, 2, 1, 0, 2])  # row 2 twice: one sequence of its 3 positions and 2 copies
    scorer, shapes = _scored_shapes(adapter, batch, rows, _overrides(adapter.token_mask(batch), rows, 4)[0])
    # sequences of widths 15, 14 | 7, 5 in two passes (as wide as their widest), then one head pass (width 1) of
    # the five copies of both
    assert sorted(shapes) == [(2, 7), (2, 15), (5, 1)]
    _check_against_full_passes(adapter, batch, rows, scorer)
    # more copies than COPIES_PER_POSITION times the row's 6 positions: two sequences
    many = torch.tensor([1] * (6 * packing.COPIES_PER_POSITION + 3) + [0, 2, 2])
    _check_against_full_passes(adapter, batch, many, scorer)


@pytest.mark.parametrize(
    "name,left", [("distilbert", False), ("llama", True), ("llama", False), ("gpt2", True), ("qwen2", True)]
)
def test_packed_overrides_equal_full_passes_across_families(name, left):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = HuggingFaceAdapter(family_model(name))
    batch = family_batch(name, left)
    rows = torch.tensor([0, 0, 0, 2, 1, 2])
    scorer, shapes = _scored_shapes(adapter, batch, rows)
    # one sequence per row, not one per override, then the six copies' head pass
    assert sum(n for n, w in shapes if w > 1) == 3 and (6, 1) in shapes
    _check_against_full_passes(adapter, batch, rows, scorer)


@pytest.mark.parametrize("name", ["mistral", "modernbert", "modernbert-mean"])
def test_windowed_or_mean_pooled_models_keep_one_sequence_per_override(name, monkeypatch):
    if name == "mistral":  # its window is a config field: with that rule off, the check must refuse it on its own
        monkeypatch.setattr(packing, "_WINDOWED", ())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = HuggingFaceAdapter(family_model(name))
    batch = family_batch(name, False)
    rows = torch.tensor([0, 0, 1, 2])
    _, shapes = _scored_shapes(adapter, batch, rows)
    assert sum(n for n, _ in shapes) == rows.numel() and all(w > 1 for _, w in shapes)


def test_a_packed_scorer_that_disagrees_with_the_replay_is_not_used(monkeypatch):
    adapter = _bert()
    batch = _rows_of_lengths((14, 6, 3, 13), 14)
    real = packing.packed_scorer

    def off_by_a_little(*args):
        scorer = real(*args)
        return lambda rows, override: scorer(rows, override) + 1e-3 * (override is not None)

    monkeypatch.setattr(replay, "packed_scorer", off_by_a_little)
    with torch.no_grad():
        _, scorer = override_replay(adapter, adapter.embed(batch), batch)
        _, unpacked = override_replay(adapter, adapter.embed(batch), batch, pack=False)
        rows = torch.tensor([0, 1, 1])
        override = _overrides(adapter.token_mask(batch), rows, 4)[0]
        assert torch.equal(scorer(rows, override), unpacked(rows, override))


def test_rows_as_long_as_the_position_table_run_one_sequence_per_override():
    adapter = _bert(max_positions=14)
    batch = _rows_of_lengths((14, 6, 3, 13), 14)  # row 0 fills the table: no room for a copy
    rows = torch.tensor([0, 0, 1, 3, 3, 3])
    scorer, shapes = _scored_shapes(adapter, batch, rows)
    assert max(w for _, w in shapes) == 14  # row 3's 13 positions and one copy; row 0 alone, twice
    _check_against_full_passes(adapter, batch, rows, scorer)


def test_the_packed_scorer_says_it_packs_a_rows_overrides_and_the_replay_does_not():
    """Callers give a packing scorer all of a row's overrides in one call (decision flip's steps, the permutations):
    the packed scorer says it packs; the one-sequence-per-override replay (``pack=False``) does not."""
    from lightning_xai.adapters.capabilities import PackingScorer, packs_overrides

    adapter = _bert()
    batch = _rows_of_lengths((14, 6, 3, 13), 14)
    with torch.no_grad():
        _, packed = override_replay(adapter, adapter.embed(batch), batch)
        _, unpacked = override_replay(adapter, adapter.embed(batch), batch, pack=False)
    assert isinstance(packed, packing.PackedScorer) and isinstance(packed, PackingScorer) and packs_overrides(packed)
    assert unpacked is not None and not packs_overrides(unpacked)
    _check_against_full_passes(adapter, batch, torch.tensor([1] * 9 + [0, 2, 2]), packed)


def test_the_copies_of_several_passes_join_for_one_head_pass_only_where_each_holds_one_row_per_copy():
    a, b = torch.randn(2, 1, 4), torch.randn(3, 1, 4)
    joined = packing._joined_copies([(a, None), (b, None)], [2, 3])
    assert torch.equal(joined[0], torch.cat([a, b])) and joined[1] is None
    assert packing._joined_copies([a], [2]) is None  # one pass: nothing to join
    # a leaf that is not one row per copy (here a per-sequence tensor), or parts of different layouts: head per pass
    assert packing._joined_copies([(a, torch.randn(5, 2, 2)), (b, torch.randn(5, 2, 2))], [2, 3]) is None
    assert packing._joined_copies([(a,), b], [2, 3]) is None
    assert packing._joined_copies([a, b.double()], [2, 3]) is None


def test_a_windowed_override_computes_the_rows_it_reads_as_the_whole_call_does():
    """A packed pass's window (the rows from the first copy on, the keys any row sees) gives those rows' outputs of
    the whole call, with the override's rows replaced as in it; the rows before the window are zeros, and the
    scores computed are the window's only."""
    from lightning_xai.adapters.huggingface.attention import OverrideState, _lightning_xai_attention, active_override

    adapter = _bert()
    module = adapter._attention_modules[-1]
    g = torch.Generator().manual_seed(0)
    B, H, T, d, first, keys = 3, 2, 9, 4, 5, 6
    q, k, v = (torch.randn(B, H, T, d, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(B, 1, T, T, dtype=torch.float64)
    mask[..., keys:] = torch.finfo(torch.float64).min  # no query sees a key past column keys
    replaced = torch.zeros(B, T, dtype=torch.bool)
    replaced[:, first + 1], replaced[0, T - 1] = True, True
    rows = torch.rand(B, 1, 1, T, generator=g, dtype=torch.float64)
    rows[..., keys:] = 0.0

    def call(window):
        def make_rows(weights):  # half the own row, half a given one: depends on the weights computed
            return 0.5 * weights + 0.5 * rows[..., : weights.shape[-1]].expand_as(weights)

        cut = replaced if window is None else replaced[:, window[0] :]
        token = active_override().set(OverrideState(module, cut, make_rows, window=window))
        try:
            return _lightning_xai_attention(module, q, k, v, mask, scaling=0.5)
        finally:
            active_override().reset(token)

    whole, whole_weights = call(None)
    part, part_weights = call((first, keys))
    assert part.shape == whole.shape and part_weights.shape == (B, H, T - first, keys)
    assert torch.allclose(part[:, first:], whole[:, first:], rtol=0, atol=1e-12)
    assert torch.equal(part[:, :first], torch.zeros_like(part[:, :first]))
    assert torch.allclose(part_weights, whole_weights[:, :, first:, :keys], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name,left", [("llama", False), ("llama", True), ("distilbert", False)])
def test_a_packed_pass_that_needs_no_own_weights_skips_them_with_the_same_logits_bit_for_bit(name, left, monkeypatch):
    """With no special token to keep mass on (a decoder's batch, or raw rows), the packed pass does not compute the
    copies' own attention (scores, softmax), which the override replaces whole: the logits are those of the pass
    that computes and discards them, bit for bit; with special tokens ([CLS]/[SEP]) the own weights are read."""
    import lightning_xai.adapters.huggingface.attention as attention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = HuggingFaceAdapter(family_model(name))
    batch = family_batch(name, left)
    rows = torch.tensor([0, 0, 0, 2, 1, 2])
    tokens, raw = _overrides(adapter.token_mask(batch), rows, adapter.model.config.num_attention_heads)
    eager_calls = []
    original, reads_own = attention._eager_for, packing.rows_read_own
    monkeypatch.setattr(attention, "_eager_for", lambda module: eager_calls.append(module) or original(module))

    def scored(read_own):
        # read_own: the pass as it was (the own weights computed, then replaced); else the adapter's own decision
        monkeypatch.setattr(packing, "rows_read_own", (lambda *args: True) if read_own else reads_own)
        with torch.no_grad():
            _, scorer = adapter.override_replay(adapter.embed(batch), batch)
            eager_calls.clear()
            found = [scorer(rows, tokens), scorer(rows, raw.to(tokens.dtype))]
        return found, list(eager_calls)

    computed, with_own = scored(read_own=True)
    skipped, without_own = scored(read_own=False)
    last = adapter._attention_modules[-1]
    has_specials = bool((adapter._attention_mask(batch).bool() & ~adapter.token_mask(batch)).any())
    assert sum(m is last for m in with_own) == 2  # one packed pass per call computed the last layer's weights
    assert sum(m is last for m in without_own) == (1 if has_specials else 0)  # a [B, T] override keeps [SEP]'s
    for a, b in zip(computed, skipped):
        assert torch.equal(a, b)


def test_an_override_without_special_tokens_is_used_as_given():
    from lightning_xai.adapters.huggingface.attention import override_rows

    own = torch.rand(1, 2, 3, 3).softmax(-1)
    override = torch.tensor([[0.2, 0.3, 0.5]])
    present = torch.ones(1, 3, dtype=torch.bool)
    plain = override_rows(override, present, present, "keep")(own)
    assert torch.equal(plain, override[:, None, None, :].expand_as(own))
    special_first = override_rows(torch.tensor([[0.0, 0.4, 0.6]]), present, torch.tensor([[False, True, True]]), "keep")
    kept = special_first(own)  # each head keeps its own mass on the special token
    assert torch.allclose(kept[..., 0], own[..., 0]) and torch.allclose(kept.sum(-1), torch.ones(1, 2, 3))

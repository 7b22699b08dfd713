"""Issue 18 (cost): leave-one-out and erasure variants run sorted by length, each pass trimmed to its longest variant.

Oracle: every variant run alone, at its own length, without any padding (a straightforward per-row loop through the
same model) — on a tiny random BERT (right padding, [CLS]/[SEP] outside the token mask), a tiny Llama (left padding,
a <bos> outside the token mask) and the reference AttentionClassifier (BiLSTM; with and without special tokens).
The batched results must match to float rounding whatever the pass sizes, and the passes must really be narrower
than the batch (right padding) or exactly as wide (left padding: leading pads are never dropped)."""

from __future__ import annotations

import importlib
import os
import warnings

import pytest
import torch

from lightning_xai.attribution import attribute, batching
from lightning_xai.attribution.batching import erase_tokens, length_chunks, padding_trimmer, row_extents
from lightning_xai.metrics.functional import erasure_probabilities
from lightning_xai.models import AttentionClassifier

os.environ.setdefault("HF_HUB_OFFLINE", "1")
LENGTHS = (11, 2, 6, 1, 9, 4, 13)  # real tokens per row (a one-token row exercises the pad fallback)


# --- the models and batches --------------------------------------------------------------------------------------
def _bert():
    from transformers import BertConfig, BertForSequenceClassification

    from lightning_xai.adapters import HuggingFaceAdapter

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=2,
        pad_token_id=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.5,
        attn_implementation="eager",
    )
    return HuggingFaceAdapter(BertForSequenceClassification(config).double().eval())


def _llama():
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from lightning_xai.adapters import HuggingFaceAdapter

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=60,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        num_labels=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.5,
        attn_implementation="eager",
    )
    return HuggingFaceAdapter(LlamaForSequenceClassification(config).double().eval())


def _reference():
    torch.manual_seed(0)
    return AttentionClassifier(vocab_size=60, num_classes=2, embedding_dim=12, hidden_dim=6).double().eval()


def _batch(kind: str) -> dict:
    """Rows of LENGTHS real tokens; 'bert': [CLS] w.. [SEP] right-padded; 'llama': <bos> w.. left-padded;
    'reference': w.. right-padded; 'specials': <sos> w.. <eos> right-padded, read through input_mask."""
    g = torch.Generator().manual_seed(1)
    extra = {"bert": 2, "llama": 1, "reference": 0, "specials": 2}[kind]
    T = max(LENGTHS) + extra
    B = len(LENGTHS)
    ids = torch.zeros(B, T, dtype=torch.long)
    present = torch.zeros(B, T, dtype=torch.bool)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(LENGTHS):
        start = T - n - extra if kind == "llama" else 0
        row = torch.randint(4, 60, (n,), generator=g)
        if kind == "llama":
            ids[b, start], ids[b, start + 1 : start + 1 + n] = 1, row
            mask[b, start + 1 : start + 1 + n] = True
        elif extra:
            ids[b, 0], ids[b, 1 : n + 1], ids[b, n + 1] = 2, row, 3
            mask[b, 1 : n + 1] = True
        else:
            ids[b, :n] = row
            mask[b, :n] = True
        present[b, start : start + n + extra] = True
    out = {"input_ids": ids, "mask": mask, "labels": torch.arange(B) % 2, "rationale": mask & (ids % 2 == 0)}
    if kind in ("bert", "llama"):
        out["attention_mask"] = present.long()
        if kind == "bert":
            out["token_type_ids"] = torch.zeros_like(ids)
    elif kind == "specials":
        out["input_mask"] = present
    return out


CASES = {"bert": _bert, "llama": _llama, "reference": _reference, "specials": _reference}
# Llama's rotary tables are float32 even in a float64 model: a left-padded row (positions start after its pads) and the
# row alone (positions from 0) agree to ~3e-7, not 1e-15 — the batched code runs the left-padded rows at their width.
ATOL = {"bert": 1e-9, "llama": 1e-6, "reference": 1e-9, "specials": 1e-9}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    return request.param, CASES[request.param](), _batch(request.param)


# --- the oracle: one variant at a time, at its own length ----------------------------------------------------------
def _alone(batch: dict, b: int, keep: torch.Tensor) -> dict:
    """Row b of the batch with only the columns in ``keep`` (a bool [T]), as a batch of one, no padding."""
    present = next(batch[k] for k in ("input_mask", "attention_mask", "mask") if k in batch)[b].bool()
    cols = (present & keep).nonzero().flatten()
    return {k: v[b : b + 1, cols] if torch.is_tensor(v) and v.dim() == 2 else v[b : b + 1] for k, v in batch.items()}


def _prob(model, row: dict, target: int, embeddings=None) -> float:
    with torch.no_grad():
        emb = model.embed(row) if embeddings is None else embeddings
        return float(model.forward_from_embeddings(emb, row).logits.softmax(-1)[0, target])


def _loo_by_hand(model, batch: dict, target: torch.Tensor, mode: str) -> torch.Tensor:
    mask = model.token_mask(batch)
    B, T = mask.shape
    expected = torch.zeros(B, T, dtype=torch.float64)
    everything = torch.ones(T, dtype=torch.bool)
    pad_id = getattr(model, "pad_token_id", None) or 0
    for b in range(B):
        full = _alone(batch, b, everything)
        p = _prob(model, full, int(target[b]))
        cols = _alone(batch, b, everything)  # which column of the row alone is position i of the batch
        offset = int(
            next(batch[k] for k in ("input_mask", "attention_mask", "mask") if k in batch)[b].bool().long().argmax()
        )
        for i in mask[b].nonzero().flatten().tolist():
            if mode == "delete" and int(mask[b].sum()) > 1:
                keep = everything.clone()
                keep[i] = False
                q = _prob(model, _alone(batch, b, keep), int(target[b]))
            else:  # the pad embedding in place of token i (delete mode falls back to it for one-token rows)
                padded = {**cols, "input_ids": cols["input_ids"].clone()}
                padded["input_ids"][0, i - offset] = pad_id
                with torch.no_grad():
                    emb = model.embed(cols).clone()
                    emb[0, i - offset] = model.embed(padded)[0, i - offset]
                q = _prob(model, cols, int(target[b]), emb)
            expected[b, i] = p - q
    return expected


def _record_passes(model, monkeypatch) -> list:
    """Patch the model's forward_from_embeddings to record each pass's (rows, width, all-pad last column?)."""
    passes = []
    original = model.forward_from_embeddings

    def recording(embeddings, batch, **kwargs):
        present = next((batch[k] for k in ("input_mask", "attention_mask", "mask") if k in batch), None)
        passes.append((embeddings.shape[0], embeddings.shape[1], bool(present[:, -1].any())))
        return original(embeddings, batch, **kwargs)

    monkeypatch.setattr(model, "forward_from_embeddings", recording)
    # the padding check's two small passes (tested in test_a_model_that_reads_its_padding_is_never_trimmed) aside
    for module in (
        "lightning_xai.attribution.occlusion",
        "lightning_xai.metrics.functional.erasure",
        "lightning_xai.metrics.functional.decision_flips",
    ):
        monkeypatch.setattr(importlib.import_module(module), "padding_trimmer", lambda *a: batching._trim_padding)
    return passes


# --- leave-one-out -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["delete", "pad"])
@pytest.mark.parametrize("internal_batch_size", ["auto", 3])
def test_leave_one_out_matches_each_variant_run_alone(case, mode, internal_batch_size):
    name, model, batch = case
    target = torch.arange(len(LENGTHS)) % 2
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="leave_one_out", category=RuntimeWarning)
        scores = attribute(
            model, batch, "leave_one_out", target, mode=mode, signed=True, internal_batch_size=internal_batch_size
        )
    expected = _loo_by_hand(model, batch, target, mode)
    assert expected.abs().max() > 1e-3  # the oracle is not trivially zero
    torch.testing.assert_close(scores.double(), expected, rtol=0, atol=ATOL[name])


def test_leave_one_out_graph_path_matches_too():
    """create_graph=True: the BiLSTM cannot reuse its states, so the generic (trimmed) delete path runs."""
    model, batch = _reference(), _batch("specials")
    target = torch.arange(len(LENGTHS)) % 2
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="leave_one_out", category=RuntimeWarning)
        for mode in ("delete", "pad"):
            scores = attribute(
                model, batch, "leave_one_out", target, mode=mode, signed=True, create_graph=True, internal_batch_size=4
            )
            assert scores.requires_grad
            torch.testing.assert_close(scores.detach(), _loo_by_hand(model, batch, target, mode), rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_leave_one_out_passes_are_sorted_and_trimmed(name, monkeypatch):
    model, batch = CASES[name](), _batch(name)
    passes = _record_passes(model, monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="leave_one_out", category=RuntimeWarning)
        attribute(model, batch, "leave_one_out", None, internal_batch_size=4)
    T = batch["input_ids"].shape[1]
    full, deleted, padded = passes[0], passes[1:-1], passes[-1]  # the one-token row's pad-mode pass comes last
    assert full == (len(LENGTHS), T, True) and padded[0] == 1
    assert sum(rows for rows, _, _ in passes[1:]) == sum(LENGTHS)
    assert all(rows <= 4 for rows, _, _ in passes[1:])
    if name == "bert":  # right padding: every pass ends at its longest variant, so the passes grow in width
        assert all(ends for _, _, ends in passes[1:]) and padded[1] == 3
        widths = [w for _, w, _ in deleted]
        assert widths == sorted(widths) and widths[0] < T - 1
        assert sum(r * w for r, w, _ in deleted) < sum(r for r, _, _ in deleted) * (T - 1)
    else:  # left padding: nothing can be trimmed without moving positions; every deletion pass is T - 1 wide
        assert {w for _, w, _ in deleted} == {T - 1} and padded[1] == T


# --- erasure -------------------------------------------------------------------------------------------------------
def _removals(model, batch):
    mask = model.token_mask(batch)
    g = torch.Generator().manual_seed(2)
    removals = []
    for p in (0.1, 0.5, 0.9):  # comprehensiveness-like (few deleted) to sufficiency-like (few kept)
        r = mask & (torch.rand(mask.shape, generator=g) < p)
        first = mask.long().argmax(1)
        r[torch.arange(mask.shape[0]), first] = False  # keep a token in every row
        removals.append(r)
    return removals


@pytest.mark.parametrize("limits", [{}, {"max_rows": 3}, {"max_tokens": 20}])
def test_erasure_probabilities_match_each_row_run_alone(case, limits):
    name, model, batch = case
    removals = _removals(model, batch)
    target = torch.arange(len(LENGTHS)) % 2
    probs = erasure_probabilities(model, batch, removals, target, **limits)
    assert probs.shape == (3, len(LENGTHS))
    for k, r in enumerate(removals):
        for b in range(len(LENGTHS)):
            expected = _prob(model, _alone(batch, b, ~r[b]), int(target[b]))
            assert float(probs[k, b]) == pytest.approx(expected, abs=ATOL[name]), (name, k, b)


def test_erasure_passes_are_trimmed_to_their_longest_row(monkeypatch):
    model, batch = _bert(), _batch("bert")
    removals = _removals(model, batch)
    width = erase_tokens(model, batch, removals[0])["input_ids"].shape[1]
    passes = _record_passes(model, monkeypatch)
    erasure_probabilities(model, batch, removals, torch.zeros(len(LENGTHS), dtype=torch.long), max_tokens=40)
    distinct = {(row, tuple(r[row].tolist())) for r in removals for row in range(len(LENGTHS))}
    assert sum(r for r, _, _ in passes) == len(distinct) < 3 * len(LENGTHS)  # a repeated erasure is scored once
    assert all(ends for _, _, ends in passes) and [w for _, w, _ in passes] == sorted(w for _, w, _ in passes)
    assert all(r * w <= 40 or r == 1 for r, w, _ in passes) and passes[0][1] < width


def test_erasure_probabilities_rejects_bad_limits():
    model, batch = _reference(), _batch("reference")
    for limits in ({"max_rows": 0}, {"max_tokens": -1}, {"max_rows": 2.5}):
        with pytest.raises(ValueError, match="positive int"):
            erasure_probabilities(model, batch, _removals(model, batch), torch.zeros(7, dtype=torch.long), **limits)


# --- the utility ---------------------------------------------------------------------------------------------------
def _cost(chunks, lengths, pass_cost):
    return sum(c.numel() * int(lengths[c].max()) + pass_cost for c in chunks)


def test_length_chunks_cover_sort_and_respect_the_budget():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (500,), generator=g)
    for budget, cap in ((64, None), (300, 7), (1000, None), (10, None), (4096, 64)):
        chunks = length_chunks(lengths, budget, max_rows=cap)
        order = torch.cat(chunks)
        assert sorted(order.tolist()) == list(range(500))
        assert lengths[order].tolist() == sorted(lengths.tolist())
        for c in chunks:
            assert c.numel() == 1 or c.numel() * int(lengths[c].max()) <= budget
            assert cap is None or c.numel() <= cap
    assert [c.tolist() for c in length_chunks([50, 3], 10)] == [[1], [0]]  # over budget: a pass of its own
    assert length_chunks(torch.zeros(0, dtype=torch.long), 10) == []
    with pytest.raises(ValueError, match="positive int"):
        length_chunks([1, 2], 0)


def test_length_chunks_cut_near_the_cheapest_partition():
    """Against every partition of the sorted variants into consecutive passes (brute force, small cases): the
    padded tokens + pass_cost per pass are within 25% of the cheapest, usually equal; and far below the naive
    fill-each-pass-to-the-budget cut on a realistic spread of lengths."""
    import itertools
    import random

    rng = random.Random(0)
    equal = 0
    for _ in range(400):
        lengths = torch.tensor([rng.randint(1, 12) for _ in range(rng.randint(1, 8))])
        budget, cap, pass_cost = rng.randint(8, 60), rng.choice([None, 2, 3]), rng.randint(1, 10)
        ordered = sorted(lengths.tolist())
        cheapest = float("inf")
        for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [len(ordered)]
            parts = [ordered[a:b] for a, b in zip(bounds, bounds[1:])]
            if all((len(p) == 1 or len(p) * p[-1] <= budget) and (cap is None or len(p) <= cap) for p in parts):
                cheapest = min(cheapest, sum(len(p) * p[-1] + pass_cost for p in parts))
        got = _cost(length_chunks(lengths, budget, max_rows=cap, pass_cost=pass_cost), lengths, pass_cost)
        assert cheapest <= got <= 1.25 * cheapest
        equal += got == cheapest
    assert equal >= 360
    lengths = torch.randint(3, 40, (400,), generator=torch.Generator().manual_seed(1))  # an audit batch's variants
    order = torch.sort(lengths, stable=True).indices
    naive, start = [], 0  # fill each pass up to 4096 tokens
    while start < order.numel():
        end = start + 1
        while end < order.numel() and (end + 1 - start) * int(lengths[order[end]]) <= 4096:
            end += 1
        naive.append(order[start:end])
        start = end
    ours = _cost(length_chunks(lengths, 4096), lengths, 128)
    assert ours < 0.95 * _cost(naive, lengths, 128)


def test_row_extents_follow_the_pad_indicator():
    assert row_extents(_batch("bert"), 7).tolist() == [n + 2 for n in LENGTHS]
    assert row_extents(_batch("specials"), 7).tolist() == [n + 2 for n in LENGTHS]  # input_mask, not mask
    T = max(LENGTHS) + 1
    assert row_extents(_batch("llama"), 7).tolist() == [T] * 7
    assert row_extents({"input_ids": torch.ones(2, 5, dtype=torch.long)}, 2).tolist() == [5, 5]


def test_a_model_that_reads_its_padding_is_never_trimmed():
    """An LSTM run over the pads (no packing) gives other logits on a trimmed pass: the passes keep the width."""
    from benchmarks.models import UnpackedBiLSTMClassifier

    reference, batch = _reference(), _batch("reference")
    assert padding_trimmer(reference, batch, len(LENGTHS)) is batching._trim_padding  # packed: pads never read
    unpacked = UnpackedBiLSTMClassifier.from_reference(reference.float()).double().eval()
    assert padding_trimmer(unpacked, batch, len(LENGTHS)) is not batching._trim_padding
    target = unpacked.forward_from_embeddings(unpacked.embed(batch), batch).logits.argmax(-1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="leave_one_out", category=RuntimeWarning)
        got = attribute(unpacked, batch, "leave_one_out", target, mode="pad", signed=True)
    # by hand at the batch's width: each real token replaced by the pad embedding (0) in a full-width copy
    emb = unpacked.embed(batch)
    full = unpacked.forward_from_embeddings(emb, batch).logits.softmax(-1).gather(1, target.view(-1, 1))[:, 0]
    for b, t in batch["mask"].nonzero().tolist():
        x = emb.clone()
        x[b, t] = 0.0
        p = unpacked.forward_from_embeddings(x, batch).logits.softmax(-1)[b, target[b]]
        assert float(got[b, t]) == pytest.approx(float(full[b] - p), abs=1e-9)


def test_a_model_that_scores_its_own_deletions_runs_no_trimming_check(monkeypatch):
    """The BiLSTM's DeletionLogits scores every deletion: leave-one-out runs one full pass, no padding check."""
    import lightning_xai.attribution.occlusion as occlusion

    reference = _reference()
    several = torch.tensor([i for i, n in enumerate(LENGTHS) if n > 1])  # a one-token row is scored by a pad pass
    batch = batching.gather_rows(_batch("reference"), several, len(LENGTHS))
    expected = attribute(reference, batch, "leave_one_out")
    monkeypatch.setattr(occlusion, "padding_trimmer", lambda *args: pytest.fail("padding check, no full pass left"))
    calls = []
    run = reference.forward_from_embeddings
    monkeypatch.setattr(reference, "forward_from_embeddings", lambda *a, **k: calls.append(1) or run(*a, **k))
    assert torch.equal(attribute(reference, batch, "leave_one_out"), expected)
    assert len(calls) == 1  # the full pass the scores start from


def test_deleting_more_tokens_in_one_row_pads_its_per_token_labels_with_minus_100():
    """A causal LM's labels follow its ids; the positions a deletion frees are padding, not token 0 (a row that loses
    more tokens than another was scored with a spurious target token 0 before)."""
    batch = {
        "input_ids": torch.tensor([[1, 5, 6, 7, 8], [1, 5, 6, 7, 8]]),
        "attention_mask": torch.ones(2, 5, dtype=torch.long),
        "labels": torch.tensor([[-100, -100, -100, 7, 8], [-100, -100, -100, 7, 8]]),
    }
    remove = torch.tensor([[False, True, True, False, False], [False, True, False, False, False]])
    out = batching.remove_tokens(batch, remove)
    assert out["labels"].tolist() == [[-100, 7, 8, -100], [-100, -100, 7, 8]]
    assert out["input_ids"].tolist() == [[1, 7, 8, 0], [1, 6, 7, 8]]

"""ErasureAudit's decision flips on long documents run their override passes within a memory budget (issue 29).

Before, the ``transformers`` override replay ran every override of a decision-flip pass (up to ``max_rows`` = 2,048)
in one last-layer pass: packed into ``N / copies`` sequences as wide as the position table, whose attention buffers
held ``sequences × heads × W²`` floats each — 44 × 2 × 2048² for two 2,000-piece documents through a tiny BERT, 6.5 GiB
of peak RSS for ``ErasureAudit()`` at its defaults. Now the sequences (packed) or rows (one override per row) of a call
run in passes whose attention buffers (:func:`~lightning_xai.adapters.huggingface.packing.attention_elements`) fit the
budget leave-one-out's reruns use (:data:`~lightning_xai.adapters.budget.PASS_BUDGET_ELEMENTS`). These tests record
the shape of every last-layer pass on real ERASER text and check the logits and flips against one unbudgeted pass;
the peak-memory figure itself is a benchmark (benchmarks/bench_erasure_memory.py).
"""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.adapters.budget import PASS_BUDGET_ELEMENTS
from lightning_xai.adapters.huggingface import replay
from lightning_xai.adapters.huggingface.packing import ATTENTION_COPIES
from lightning_xai.adapters.huggingface.replay import layer_stack, override_replay
from lightning_xai.data.readers import read_split
from lightning_xai.data.vocabulary import Vocabulary
from lightning_xai.metrics.functional.decision_flips import decision_flip

transformers = pytest.importorskip("transformers")

HEADS = 16  # many heads of width 2: the attention buffers are large next to the rest of a pass
PIECES = 400
SHORTER = 160  # the rows of the flip comparison
ROOM = 46  # positions left after the longest row: 46 copies of [CLS] a packed sequence, as at 2,000 pieces of 2,048


def _long_batch(pieces):
    """Two real ERASER movie reviews, their first ``pieces`` and ``pieces − 70`` tokens, as [CLS] tokens [SEP] rows
    (right-padded)."""
    reviews = [e.tokens for e in read_split("eraser_movies", "val")[:2]]
    texts = [reviews[0][:pieces], reviews[1][: pieces - 70]]
    vocab = Vocabulary.build(texts)
    T = pieces + 2
    ids = torch.zeros(2, T, dtype=torch.long)
    attention_mask = torch.zeros(2, T, dtype=torch.long)
    for row, text in enumerate(texts):
        ids[row, 1 : len(text) + 1] = torch.tensor(vocab.encode(text)) + 4
        ids[row, 0], ids[row, len(text) + 1] = 2, 3
        attention_mask[row, : len(text) + 2] = 1
    mask = attention_mask.bool() & (ids != 2) & (ids != 3)
    return {"input_ids": ids, "attention_mask": attention_mask, "mask": mask}, len(vocab) + 4


def _case(pieces, dtype=torch.float32):
    """A tiny random BERT (hidden 32, 16 heads) with room for 46 positions after the longest row, and the batch."""
    batch, vocab_size = _long_batch(pieces)
    config = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        intermediate_size=64,
        num_labels=2,
        max_position_embeddings=pieces + 2 + ROOM,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return HuggingFaceAdapter(transformers.BertForSequenceClassification(config).to(dtype).eval()), batch


@pytest.fixture(scope="module")
def long_case():
    return _case(PIECES)


def _pass_shapes(adapter):
    """``(shapes, handle)``: ``(sequences, width)`` of every pass of the last layer, recorded until removed."""
    shapes = []
    last = layer_stack(adapter.model, adapter._attention_modules[-1])[-1]
    handle = last.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple((args[0] if args else kwargs["hidden_states"]).shape[:2])),
        with_kwargs=True,
    )
    return shapes, handle


def _attention_elements(shape):
    sequences, width = shape
    return ATTENTION_COPIES * HEADS * sequences * width * width


def test_decision_flip_at_its_defaults_runs_every_pass_within_the_budget(long_case):
    """Three rankings of two long rows, a decision that never flips (every step of every instance is scored): the
    last-layer passes stay within the default budget, and there are several of them."""
    adapter, batch = long_case
    head = adapter.model.classifier
    saved = head.weight.detach().clone(), head.bias.detach().clone()
    with torch.no_grad():
        head.weight.mul_(1e-3)
        head.bias.copy_(torch.tensor([5.0, -5.0]))
    shapes, handle = _pass_shapes(adapter)
    try:
        noise = torch.rand(batch["mask"].shape, generator=torch.Generator().manual_seed(0))
        result = decision_flip(adapter, batch, ["attention", "gradient", noise.masked_fill(~batch["mask"], 0)])
    finally:
        handle.remove()
        with torch.no_grad():
            head.weight.copy_(saved[0])
            head.bias.copy_(saved[1])
    assert not bool(result.flipped.any())  # every step ran
    packed = [s for s in shapes if s[1] > PIECES + 2]  # the passes of packed override copies
    assert len(packed) > 10
    assert max(_attention_elements(s) for s in shapes) <= PASS_BUDGET_ELEMENTS


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "one_override_per_row"])
def test_a_small_budget_gives_the_logits_of_one_pass(long_case, pack):
    """Many overrides of both rows through a scorer with a budget of a few sequences and through an unbudgeted one:
    the same logits, and every budgeted pass within its budget."""
    adapter, batch = long_case
    budget = _attention_elements((3, PIECES + 2 + ROOM))  # about three packed sequences, or three rows, a pass
    mask = batch["mask"]
    rows = torch.arange(2).repeat_interleave(200 if pack else 8)
    weights = torch.rand(rows.numel(), mask.shape[1], generator=torch.Generator().manual_seed(1))
    weights = weights.masked_fill(~mask[rows], 0.0)
    override = weights / weights.sum(1, keepdim=True)
    with torch.no_grad():
        embeddings = adapter.embed(batch)
        _, small = override_replay(adapter, embeddings, batch, pack=pack, max_elements=budget)
        _, whole = override_replay(adapter, embeddings, batch, pack=pack, max_elements=None)
        shapes, handle = _pass_shapes(adapter)
        try:
            budgeted = small(rows, override)
            budgeted_shapes = list(shapes)
            shapes.clear()
            reference = whole(rows, override)
        finally:
            handle.remove()
    assert len(budgeted_shapes) > len(shapes) >= 1
    assert max(_attention_elements(s) for s in budgeted_shapes) <= budget
    torch.testing.assert_close(budgeted, reference, rtol=1e-5, atol=1e-5)


def test_decision_flips_under_a_small_default_budget_are_those_of_one_pass(monkeypatch):
    """The flips of the audit's rankings with the default budget shrunk to about three sequences a pass equal those
    with no budget (the decision margin set to 1e-4, so that the flips come after tens of steps; float64, which
    no rounding of a differently batched pass moves across that margin)."""
    adapter, batch = _case(SHORTER, torch.float64)
    noise = torch.rand(batch["mask"].shape, generator=torch.Generator().manual_seed(2))
    rankings = ["attention", "grad_x_attention", noise.masked_fill(~batch["mask"], 0)]
    bias = adapter.model.classifier.bias
    saved = bias.detach().clone()
    with torch.no_grad():
        logits = adapter.forward_from_embeddings(adapter.embed(batch), batch).logits
        bias[0] -= float((logits[:, 0] - logits[:, 1]).mean()) - 1e-4
    results = {}
    try:
        for budget in (_attention_elements((3, SHORTER + 2 + ROOM)), None):
            monkeypatch.setitem(replay.override_replay.__kwdefaults__, "max_elements", budget)
            results[budget] = decision_flip(adapter, batch, rankings)
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    small, whole = results.values()
    assert int(whole.flipped.sum()) >= 3 and int(whole.items_removed.max()) > 40  # flips after several passes
    assert torch.equal(small.items_removed, whole.items_removed)
    assert torch.equal(small.flipped, whole.flipped)
    torch.testing.assert_close(small.attention_removed, whole.attention_removed)

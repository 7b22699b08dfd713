"""Leave-one-out on long documents runs its rerun buffers in chunks of a memory budget (issue 14, "Memory").

Before, ``AttentionClassifier.deletion_logits`` put the reruns of every deletion variant in one buffer of
Σ_b L_b² × H floats (2.1 GiB for one 2,000-token row of the reference BiLSTM). Now the variants run in chunks
whose rerun buffers hold at most ``max_elements`` elements; these tests force several chunks on real ERASER and
SST-2 text and check the logits against the one-buffer path (``max_elements=None``) and against re-running
the model on the shortened rows. The peak-memory figure itself is a benchmark (benchmarks/bench_loo_memory.py).
"""

from __future__ import annotations

import pytest
import torch

import lightning_xai.models.classifier as classifier
from lightning_xai.attribution import attribute
from lightning_xai.data import collate
from lightning_xai.data.readers import read_split
from lightning_xai.data.vocabulary import Vocabulary
from lightning_xai.models import AttentionClassifier

HIDDEN = 8


@pytest.fixture(scope="module")
def long_batch():
    """Three real rows of different lengths: 160 and 90 tokens of ERASER movie reviews, one SST-2 sentence."""
    reviews = read_split("eraser_movies", "val")[:2]
    sentence = read_split("sst2", "val")[0]
    texts = [reviews[0].tokens[:160], sentence.tokens, reviews[1].tokens[:90]]
    vocab = Vocabulary.build(texts)
    batch = collate(
        [{"input_ids": vocab.encode(t), "mask": [1] * len(t), "labels": 0, "index": i} for i, t in enumerate(texts)]
    )
    torch.manual_seed(0)
    model = AttentionClassifier(len(vocab), 2, embedding_dim=16, hidden_dim=HIDDEN).eval()
    return model, batch


def _deletions(model, batch, max_elements):
    rows, positions = batch["mask"].nonzero(as_tuple=True)
    with torch.no_grad():
        return model.deletion_logits(model.embed(batch), batch, rows, positions, max_elements=max_elements)


def test_chunked_reruns_match_one_buffer_and_stay_in_budget(long_batch, monkeypatch):
    model, batch = long_batch
    budget = 12 * 159 * HIDDEN  # about a dozen variants of the longest row per chunk
    buffers = []

    def spy(rnn, states, rows, positions):
        out = classifier_reruns(rnn, states, rows, positions)
        buffers.append(out.source.shape[0] * out.source.shape[1])
        return out

    classifier_reruns = classifier.deletion_reruns
    monkeypatch.setattr(classifier, "deletion_reruns", spy)
    chunked = _deletions(model, batch, budget)
    n_variants = int(batch["mask"].sum())
    assert len(buffers) > 10  # several chunks
    B, T = batch["mask"].shape
    full_states = 2 * B * T * HIDDEN + HIDDEN  # each buffer also holds the full rows' states and a zero row
    assert max(buffers) - full_states <= budget
    buffers.clear()
    one_buffer = _deletions(model, batch, None)
    lengths = batch["mask"].sum(1).tolist()
    assert len(buffers) == 1 and buffers[0] - full_states == sum(L * (L - 1) * HIDDEN for L in lengths)
    assert chunked.shape == (n_variants, 2)
    torch.testing.assert_close(chunked, one_buffer, rtol=0, atol=1e-6)


def test_small_chunks_match_rerunning_the_shortened_rows(long_batch):
    """Chunks of a few variants give the logits of running the model on each shortened row."""
    model, batch = long_batch
    tiny = _deletions(model, batch, 6 * 159 * HIDDEN)
    rows, positions = batch["mask"].nonzero(as_tuple=True)
    with torch.no_grad():
        for k in range(0, rows.numel(), 37):
            keep = batch["mask"][rows[k]].clone()
            keep[positions[k]] = False
            ids = batch["input_ids"][rows[k]][keep].unsqueeze(0)
            slow = model({"input_ids": ids, "mask": torch.ones_like(ids, dtype=torch.bool)}).logits[0]
            torch.testing.assert_close(tiny[k], slow, rtol=0, atol=1e-5)


def test_default_budget_is_what_leave_one_out_uses(long_batch, monkeypatch):
    model, batch = long_batch
    default = attribute(model, batch, "leave_one_out", 0)
    monkeypatch.setattr(classifier.AttentionClassifier.deletion_logits, "__defaults__", (1000 * HIDDEN,))
    small = attribute(model, batch, "leave_one_out", 0)
    torch.testing.assert_close(small, default, rtol=0, atol=1e-6)


@pytest.mark.parametrize("bad", [0, -5])
def test_a_budget_below_one_element_is_refused(long_batch, bad):
    model, batch = long_batch
    with pytest.raises(ValueError, match="max_elements"):
        _deletions(model, batch, bad)

"""Score maps to links (argmax rules, threshold, excluded targets, padding) and piece-to-word pooling, against loops."""

from __future__ import annotations

import pytest
import torch

from lightning_xai.data import read_alignments
from lightning_xai.metrics.functional import LINK_RULES, alignment_scores, extract_links, links_to_matrix, pool_to_words


def _loop_links(scores, rule, exclude, threshold=None):
    """One sentence by plain loops: the rules as documented, ties to the lower index."""
    S, T = scores.shape
    allowed = [t for t in range(T) if not exclude[t]]
    per_target = {(max(range(S), key=lambda s: (scores[s, t].item(), -s)), t) for t in allowed} if S else set()
    per_source = {(s, max(allowed, key=lambda t: (scores[s, t].item(), -t))) for s in range(S)} if allowed else set()
    if rule == "target_argmax":
        return per_target
    if rule == "source_argmax":
        return per_source
    if rule == "intersection":
        return per_target & per_source
    return {(s, t) for s in range(S) for t in allowed if scores[s, t] >= threshold}


def _as_pairs(matrix):
    return set(map(tuple, matrix.nonzero().tolist()))


@pytest.mark.parametrize("rule", LINK_RULES)
def test_rules_equal_loops_with_ties_and_excluded_targets(rule):
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        S, T = torch.randint(1, 7, (2,), generator=g).tolist()
        scores = torch.randint(0, 4, (S, T), generator=g).double() / 3  # many ties
        exclude = (torch.rand(T, generator=g) < 0.3).tolist()
        threshold = 0.5 if rule == "threshold" else None
        links = extract_links(scores, rule, threshold=threshold, target_exclude=exclude)
        assert links.dtype == torch.bool and links.shape == (S, T)
        assert _as_pairs(links) == _loop_links(scores, rule, exclude, threshold)
        assert not links[:, torch.tensor(exclude, dtype=torch.bool)].any()


def test_ties_go_to_the_lower_index_and_excluded_targets_are_no_candidates():
    scores = torch.tensor([[0.5, 0.5, 0.9], [0.5, 0.2, 0.1]])
    assert _as_pairs(extract_links(scores)) == {(0, 0), (0, 1), (0, 2)}  # column 0 tie → source 0
    # source 0's best target (2) is excluded: its next best, the tie 0/1, goes to target 0
    assert _as_pairs(extract_links(scores, "source_argmax", target_exclude=[0, 0, 1])) == {(0, 0), (1, 0)}
    assert _as_pairs(extract_links(scores, "intersection", target_exclude=[0, 0, 1])) == {(0, 0)}


@pytest.mark.parametrize("rule", LINK_RULES)
def test_a_padded_batch_equals_each_sentence_alone(rule):
    g = torch.Generator().manual_seed(1)
    B, S, T = 5, 6, 7
    scores = torch.rand(B, S, T, generator=g)
    source_len, target_len = torch.tensor([6, 1, 3, 4, 2]), torch.tensor([7, 3, 1, 5, 2])
    source_mask = torch.arange(S) < source_len.unsqueeze(1)
    target_mask = torch.arange(T) < target_len.unsqueeze(1)
    exclude = torch.rand(B, T, generator=g) < 0.2
    scores = scores.masked_fill(~(source_mask.unsqueeze(2) & target_mask.unsqueeze(1)), float("nan"))  # pads: any
    threshold = 0.6 if rule == "threshold" else None
    batch = extract_links(
        scores, rule, threshold=threshold, target_exclude=exclude, source_mask=source_mask, target_mask=target_mask
    )
    for b in range(B):
        s, t = int(source_len[b]), int(target_len[b])
        alone = extract_links(scores[b, :s, :t], rule, threshold=threshold, target_exclude=exclude[b, :t])
        assert torch.equal(batch[b, :s, :t], alone)
        assert not batch[b, s:].any() and not batch[b, :, t:].any()


def test_bad_arguments_are_refused_with_the_fix():
    scores = torch.rand(3, 4)
    with pytest.raises(ValueError, match="Unknown link rule"):
        extract_links(scores, "argmax")
    with pytest.raises(ValueError, match="needs threshold="):
        extract_links(scores, "threshold")
    with pytest.raises(ValueError, match="used only by rule='threshold'"):
        extract_links(scores, threshold=0.3)
    with pytest.raises(ValueError, match="target_exclude has shape"):
        extract_links(scores, target_exclude=[0, 1])
    with pytest.raises(ValueError, match="floating tensor"):
        extract_links(torch.ones(3, 4, dtype=torch.long))
    bad = scores.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        extract_links(bad)
    assert extract_links(bad, target_exclude=[0, 0, 1, 0]).shape == (3, 4)  # NaN only at an excluded target: fine


def _loop_pool(scores, source_words, target_words, source_reduce, target_reduce):
    reduce = {"sum": sum, "mean": lambda v: sum(v) / len(v), "max": max}
    source_groups = {}
    for piece, word in enumerate(source_words):
        if word is not None and word >= 0:
            source_groups.setdefault(word, []).append(piece)
    target_groups = {}
    for piece, word in enumerate(target_words):
        if word is not None and word >= 0:
            target_groups.setdefault(word, []).append(piece)
    out = torch.zeros(len(source_groups), len(target_groups), dtype=scores.dtype)
    for sw, s_pieces in source_groups.items():
        for tw, t_pieces in target_groups.items():
            rows = [reduce[source_reduce]([scores[s, t].item() for s in s_pieces]) for t in t_pieces]
            out[sw, tw] = reduce[target_reduce](rows)
    return out


@pytest.mark.parametrize("source_reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("target_reduce", ["sum", "mean", "max"])
def test_pooling_equals_loops(source_reduce, target_reduce):
    g = torch.Generator().manual_seed(2)
    scores = torch.rand(7, 6, generator=g, dtype=torch.float64)
    source_words = [None, 0, 0, 1, 2, 2, None]  # <s> ... </s>
    target_words = torch.tensor([0, 1, 1, 1, 2, -1])
    pooled = pool_to_words(scores, source_words, target_words, source_reduce=source_reduce, target_reduce=target_reduce)
    assert pooled.shape == (3, 3)
    expected = _loop_pool(scores, source_words, target_words.tolist(), source_reduce, target_reduce)
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-12)


def test_default_pooling_keeps_attention_rows_distributions():
    """Sum over source pieces, mean over target pieces: each target word's column still sums to one."""
    g = torch.Generator().manual_seed(3)
    attention = torch.softmax(torch.randn(5, 9, generator=g, dtype=torch.float64), dim=-1)  # [T_pieces, S_pieces]
    pooled = pool_to_words(attention.T, [0, 0, 1, 2, 2, 2, 3, 4, 4], [0, 1, 1, 2, 2])
    torch.testing.assert_close(pooled.sum(0), torch.ones(3, dtype=torch.float64))


def test_pooling_refuses_gaps_and_mismatched_lengths():
    with pytest.raises(ValueError, match=r"words \[1\] have no piece"):
        pool_to_words(torch.rand(3, 2), [0, 2, 2], [0, 1])
    with pytest.raises(ValueError, match="one word index per piece"):
        pool_to_words(torch.rand(3, 2), [0, 1], [0, 1])
    with pytest.raises(ValueError, match="Unknown target_reduce"):
        pool_to_words(torch.rand(3, 2), [0, 1, 2], [0, 1], target_reduce="median")
    with pytest.raises(ValueError, match="below -1"):
        pool_to_words(torch.rand(3, 2), [0, -2, 1], [0, 1])


def test_piece_level_map_of_the_gold_links_recovers_them_on_the_bundled_corpus():
    """Split every word into pieces, spread each gold link over its pieces, pool, threshold: the gold comes back."""
    verses = read_alignments("val")[:40]
    pred, sure = [], []
    for i, verse in enumerate(verses):
        S, T = len(verse.source), len(verse.target)
        gold = links_to_matrix(verse.sure, (S, T)).double()
        source_words = [None] + [w for w in range(S) for _ in range(1 + (w + i) % 3)] + [None]
        target_words = [w for w in range(T) for _ in range(1 + (w * 7 + i) % 2)]
        s_index = torch.tensor([max(w, 0) if w is not None else 0 for w in source_words])
        real_source = torch.tensor([w is not None for w in source_words])
        pieces = gold[s_index][:, torch.tensor(target_words)] * real_source.unsqueeze(1)
        counts = torch.bincount(s_index[real_source], minlength=S).double()
        pieces = pieces / counts[s_index].unsqueeze(1)  # a word's score shared among its pieces
        words = pool_to_words(pieces, source_words, target_words)
        torch.testing.assert_close(words, gold)
        pred.append(extract_links(words, "threshold", threshold=0.5, target_exclude=verse.target_exclude))
        sure.append(verse.sure)
    scores = {k: float(v) for k, v in alignment_scores(pred, sure).items()}
    assert scores == {"aer": 0.0, "precision": 1.0, "recall": 1.0, "f1": 1.0}

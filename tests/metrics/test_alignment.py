"""Alignment error rate, link precision/recall/F1: hand-counted examples, a set-based oracle, properties, merging."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

from lightning_xai.data import read_alignments
from lightning_xai.metrics import AlignmentErrorRate
from lightning_xai.metrics.functional import (
    alignment_counts,
    alignment_error_rate,
    alignment_scores,
    link_set,
    links_to_matrix,
)

# Two sentences, counted by hand.
# Sentence 0: S = {(0,0), (1,1), (2,2)}, P = S + {(2,3), (3,3)}, A = {(0,0), (1,1), (3,3), (1,2)}
#   |A| = 4, |S| = 3, |A∩S| = 2 ((0,0), (1,1)), |A∩P| = 3 (+ (3,3)); (1,2) is wrong.
#   precision 3/4, recall 2/3, AER = 1 − (2 + 3) / (4 + 3) = 2/7.
# Sentence 1: S = P = {(0,1)}, A = {}: |A| = 0, |S| = 1, AER = 1 − 0/1 = 1.
# Corpus: |A| = 4, |S| = 4, |A∩S| = 2, |A∩P| = 3: AER = 1 − 5/8 = 3/8, precision 3/4, recall 1/2, F1 = 0.6.
PRED = [[(0, 0), (1, 1), (3, 3), (1, 2)], []]
SURE = [[(0, 0), (1, 1), (2, 2)], [(0, 1)]]
POSSIBLE = [[(0, 0), (1, 1), (2, 2), (2, 3), (3, 3)], [(0, 1)]]


def _oracle(pred, sure, possible=None):
    """The textbook definition with Python sets and exact fractions (counts summed over the corpus)."""
    a = s = a_s = a_p = 0
    for i, (pred_i, sure_i) in enumerate(zip(pred, sure)):
        A, S = set(pred_i), set(sure_i)
        P = S | (set(possible[i]) if possible is not None else set())
        a, s, a_s, a_p = a + len(A), s + len(S), a_s + len(A & S), a_p + len(A & P)
    if a + s == 0:
        return None
    precision = Fraction(a_p, a) if a else Fraction(0)
    recall = Fraction(a_s, s) if s else Fraction(0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else Fraction(0)
    return {"aer": 1 - Fraction(a_s + a_p, a + s), "precision": precision, "recall": recall, "f1": f1}


def _floats(scores):
    return {k: float(v) for k, v in scores.items()}


def test_hand_counted_example():
    counts = alignment_counts(PRED, SURE, POSSIBLE)
    assert [c.tolist() for c in counts] == [[4, 0], [3, 1], [2, 0], [3, 0]]
    assert _floats(alignment_scores(PRED, SURE, POSSIBLE)) == pytest.approx(
        {"aer": 3 / 8, "precision": 3 / 4, "recall": 1 / 2, "f1": 0.6}, abs=1e-15
    )
    per_sentence = alignment_error_rate(PRED, SURE, POSSIBLE, per_sentence=True)
    assert per_sentence.tolist() == pytest.approx([2 / 7, 1.0], abs=1e-15)
    # corpus AER is the micro average, not the mean of the sentence AERs (0.643)
    assert float(alignment_error_rate(PRED, SURE, POSSIBLE)) != pytest.approx(float(per_sentence.mean()))


def test_without_possible_links_aer_is_one_minus_f1():
    # P = S: sentence 0 has |A∩P| = |A∩S| = 2; corpus |A| = 4, |S| = 4 → AER = 1 − 4/8 = 1/2, P = R = F1 = 1/2
    scores = _floats(alignment_scores(PRED, SURE))
    assert scores == pytest.approx({"aer": 0.5, "precision": 0.5, "recall": 0.5, "f1": 0.5}, abs=1e-15)


def test_possible_links_not_containing_sure_are_taken_with_sure():
    only_extras = [[(2, 3), (3, 3)], []]
    assert _floats(alignment_scores(PRED, SURE, only_extras)) == _floats(alignment_scores(PRED, SURE, POSSIBLE))


def test_nothing_predicted_gives_aer_one_and_precision_zero():
    scores = _floats(alignment_scores([[], []], SURE))
    assert scores == {"aer": 1.0, "precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_no_sure_link_gives_recall_zero_and_aer_from_precision():
    # |S| = 0, A = {(0,0), (1,1)}, P = {(0,0)}: AER = 1 − (0 + 1) / (2 + 0) = 1/2, precision 1/2, recall 0
    scores = _floats(alignment_scores([[(0, 0), (1, 1)]], [[]], [[(0, 0)]]))
    assert scores == {"aer": 0.5, "precision": 0.5, "recall": 0.0, "f1": 0.0}


def test_nothing_to_score_is_nan_with_a_warning():
    with pytest.warns(UserWarning, match="undefined"):
        scores = alignment_scores([[]], [[]])
    assert all(math.isnan(float(v)) for v in scores.values())
    per_sentence = alignment_error_rate([[], [(0, 0)]], [[], [(0, 0)]], per_sentence=True)  # no warning per sentence
    assert math.isnan(per_sentence[0]) and float(per_sentence[1]) == 0.0
    metric = AlignmentErrorRate()
    metric.update([[]], [[]])
    with pytest.warns(UserWarning, match="undefined"):
        out = metric.compute()
    assert math.isnan(float(out["aer"])) and float(out["sentences"]) == 1.0


def test_link_formats_agree():
    pairs = [(0, 1), (2, 0), (2, 1)]
    matrix = links_to_matrix(pairs, (3, 2))
    assert matrix.tolist() == [[False, True], [False, False], [True, True]]
    assert link_set(matrix) == link_set(torch.tensor(pairs)) == link_set([[0, 1], (2, 0), (2, 1), (0, 1)]) == set(pairs)
    assert link_set(torch.zeros(0, 2, dtype=torch.long)) == frozenset()
    sure = [[(0, 1), (1, 1)]]
    expected = _floats(alignment_scores([pairs], sure))
    assert _floats(alignment_scores([matrix], sure)) == expected
    assert _floats(alignment_scores(matrix.unsqueeze(0), [links_to_matrix(sure[0], (3, 2))])) == expected
    assert _floats(alignment_scores([set(pairs)], [torch.tensor(sure[0])])) == expected


def test_bad_links_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="one sentence.*pass \\[links\\]"):
        alignment_error_rate([(0, 0), (1, 1)], [(0, 0)])
    with pytest.raises(ValueError, match="different numbers of sentences"):
        alignment_error_rate([[(0, 0)], []], [[(0, 0)]])
    with pytest.raises(ValueError, match="differ in shape.*pool_to_words"):
        alignment_error_rate([torch.zeros(4, 5, dtype=torch.bool)], [torch.zeros(3, 5, dtype=torch.bool)])
    with pytest.raises(TypeError, match="extract_links"):
        alignment_error_rate([torch.rand(3, 3)], [[(0, 0)]])
    with pytest.raises(ValueError, match="negative index"):
        alignment_error_rate([[(0, -1)]], [[(0, 0)]])
    with pytest.raises(ValueError, match="not a \\(source_index, target_index\\) pair"):
        alignment_error_rate([[(0, 1, 2)]], [[(0, 0)]])
    with pytest.raises(ValueError, match=r"\[B, S, T\].*\[links\]"):
        alignment_error_rate(torch.zeros(3, 3, dtype=torch.bool), [[(0, 0)]])
    with pytest.raises(ValueError, match="outside"):
        links_to_matrix([(3, 0)], (3, 2))


def _corpus_strategy():
    pair = hs.tuples(hs.integers(0, 5), hs.integers(0, 5))
    sentence = hs.lists(pair, max_size=12)
    return hs.integers(1, 6).flatmap(
        lambda n: hs.tuples(*(hs.lists(sentence, min_size=n, max_size=n) for _ in range(3)))
    )


@settings(max_examples=80, deadline=None)
@given(_corpus_strategy())
def test_scores_equal_the_set_oracle_and_lie_in_the_unit_interval(corpus):
    pred, sure, possible = corpus
    for extra in (None, possible):
        expected = _oracle(pred, sure, extra)
        if expected is None:
            continue
        scores = _floats(alignment_scores(pred, sure, extra))
        assert scores == pytest.approx({k: float(v) for k, v in expected.items()}, abs=1e-12)
        assert all(0.0 <= v <= 1.0 for v in scores.values())
    plain = _oracle(pred, sure)
    if plain is not None:
        scores = _floats(alignment_scores(pred, sure))
        assert scores["aer"] == pytest.approx(1.0 - scores["f1"], abs=1e-12)  # P = S


@settings(max_examples=60, deadline=None)
@given(_corpus_strategy())
def test_any_prediction_between_sure_and_possible_scores_zero(corpus):
    _, sure, possible = corpus
    if any(sure):  # without a sure link, A = S = {} has nothing to score (NaN, tested above)
        assert float(alignment_error_rate(sure, sure, possible)) == 0.0  # A = S
        assert float(alignment_error_rate(sure, sure)) == 0.0
    if any(sure) or any(possible):
        union = [set(s) | set(p) for s, p in zip(sure, possible)]
        assert float(alignment_error_rate(union, sure, possible)) == 0.0  # A = P ∪ S


@settings(max_examples=40, deadline=None)
@given(_corpus_strategy(), hs.integers(0, 6))
def test_updates_on_two_halves_merge_to_the_whole(corpus, cut):
    pred, sure, possible = corpus
    cut = min(cut, len(pred))
    whole = AlignmentErrorRate()
    whole.update(pred, sure, possible)
    first, second = AlignmentErrorRate(), AlignmentErrorRate()
    first.update(pred[:cut], sure[:cut], possible[:cut])
    second.update(pred[cut:], sure[cut:], possible[cut:])
    first.merge_state(second)  # what a DDP sync does with the sum states
    if _oracle(pred, sure, possible) is None:
        return
    assert _floats(first.compute()) == _floats(whole.compute())
    stepwise = AlignmentErrorRate()
    for i in range(len(pred)):
        stepwise.update(pred[i : i + 1], sure[i : i + 1], possible[i : i + 1])
    assert _floats(stepwise.compute()) == _floats(whole.compute())


def test_class_matches_functional_and_declares_its_direction():
    metric = AlignmentErrorRate()
    metric.update(PRED[:1], SURE[:1], POSSIBLE[:1])
    metric.update(PRED[1:], SURE[1:], POSSIBLE[1:])
    out = metric.compute()
    assert {k: float(v) for k, v in out.items() if k != "sentences"} == _floats(alignment_scores(PRED, SURE, POSSIBLE))
    assert float(out["sentences"]) == 2
    assert AlignmentErrorRate.higher_is_better is False and AlignmentErrorRate.is_differentiable is False
    assert AlignmentErrorRate.full_state_update is False
    assert all(fx is not None and fx.__name__ == "dim_zero_sum" for fx in metric._reductions.values())


def test_gold_links_score_zero_on_the_bundled_corpus():
    verses = read_alignments("val")
    sure = [v.sure for v in verses]
    matrices = [links_to_matrix(v.sure, (len(v.source), len(v.target))) for v in verses]
    assert float(alignment_error_rate(matrices, sure)) == 0.0
    # dropping every other verse's links: |A| = |A∩S| = kept, |S| = 4000 → AER = 1 − 2·kept / (kept + 4000)
    halved = [s if i % 2 else [] for i, s in enumerate(sure)]
    kept = sum(len(s) for s in halved)
    assert float(alignment_error_rate(halved, sure)) == pytest.approx(1 - 2 * kept / (kept + 4000), abs=1e-12)

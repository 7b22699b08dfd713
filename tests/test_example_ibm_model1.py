"""examples/ibm_model1.py: EM against a plain-loop EM, grow-diag-final-and by hand, and a run on bundled verses."""

import sys
from collections import defaultdict
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# Koehn's textbook corpus (Statistical Machine Translation, ch. 4)
E = [["the", "house"], ["the", "book"], ["a", "book"]]
F = [["das", "haus"], ["das", "buch"], ["ein", "buch"]]


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLES))
    import ibm_model1

    yield ibm_model1
    sys.path.remove(str(EXAMPLES))


def _loop_em(e_sentences, f_sentences, iterations):
    """IBM Model 1 EM written out with dictionaries, NULL as None, uniform start over the f vocabulary."""
    f_vocab = {f for sentence in f_sentences for f in sentence}
    t = defaultdict(lambda: 1.0 / len(f_vocab))
    for _ in range(iterations):
        count, total = defaultdict(float), defaultdict(float)
        for e_sent, f_sent in zip(e_sentences, f_sentences):
            es = [None] + list(e_sent)
            for f in f_sent:
                z = sum(t[(f, e)] for e in es)
                for e in es:
                    count[(f, e)] += t[(f, e)] / z
                    total[e] += t[(f, e)] / z
        t = defaultdict(float, {(f, e): c / total[e] for (f, e), c in count.items()})
    return t


@pytest.mark.parametrize("iterations", [1, 3, 10])
def test_em_equals_the_loop_version(example, iterations):
    model = example.train_model1(E, F, iterations)
    reference = _loop_em(E, F, iterations)
    for (f, e), value in reference.items():
        assert model.t(f, e) == pytest.approx(value, abs=1e-12)
    assert model.t("haus", "book") == 0.0  # never co-occur
    # EM moves the mass the textbook way: das ← the, buch ← book, haus ← house (after one step t(das|the) = 1/2)
    assert (
        iterations == 1
        or model.t("das", "the") > 0.5
        and model.t("buch", "book") > 0.5
        and model.t("haus", "house") > 0.5
    )
    for e in ("the", "house", "book", "a", None):
        assert sum(model.t(f, e) for f in ("das", "haus", "buch", "ein")) == pytest.approx(1.0)


def test_viterbi_links_each_word_to_its_best_translation(example):
    model = example.train_model1(E, F, 10)
    assert example.viterbi_links(model, ["the", "house"], ["das", "haus"]) == {(0, 0), (1, 1)}
    assert example.viterbi_links(model, ["a", "book"], ["ein", "buch"]) == {(0, 0), (1, 1)}


def test_symmetrizations_by_hand(example):
    forward = {(0, 0), (1, 1), (2, 1), (4, 4)}
    backward = {(0, 0), (1, 1), (1, 2), (3, 5)}
    sym = example.symmetrize
    assert sym(forward, backward, "intersection") == {(0, 0), (1, 1)}
    assert sym(forward, backward, "union") == forward | backward
    # grow-diag: (2,1) neighbours (1,1) and source 2 is unaligned; (1,2) neighbours (1,1) and target 2 is unaligned.
    # final-and: (3,5) and (4,4) have both words unaligned (4,4 first in sorted order, then 3,5: both still free).
    assert sym(forward, backward, "grow-diag-final-and") == {(0, 0), (1, 1), (2, 1), (1, 2), (4, 4), (3, 5)}
    # a union link whose words are both aligned already is not added
    assert sym({(0, 0), (1, 1)}, {(0, 0), (1, 1), (0, 1)}, "grow-diag-final-and") == {(0, 0), (1, 1)}
    with pytest.raises(ValueError, match="Unknown symmetrization"):
        sym(forward, backward, "grow")


def test_aligns_bundled_verses_better_than_chance(example):
    from lightning_xai.data import read_alignments
    from lightning_xai.metrics.functional import alignment_error_rate

    verses = read_alignments("val")
    sure = [v.sure for v in verses]
    runs = {
        how: example.align_corpus(verses, verses, iterations=5, how=how)
        for how in ("intersection", "grow-diag-final-and", "union")
    }
    for i, verse in enumerate(verses):
        assert runs["intersection"][i] <= runs["grow-diag-final-and"][i] <= runs["union"][i]
        assert all(not verse.target_exclude[t] for _, t in runs["union"][i])
    aer = {how: float(alignment_error_rate(pred, sure)) for how, pred in runs.items()}
    # a diagonal guess (source i ↔ the i-th alignable target word) as the floor to beat
    diagonal = [[(s, t) for s, t in zip(range(len(v.source)), v.aligned_targets)] for v in verses]
    assert aer["grow-diag-final-and"] < float(alignment_error_rate(diagonal, sure)) - 0.2

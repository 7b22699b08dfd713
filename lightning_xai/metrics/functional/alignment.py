"""Word-alignment quality of predicted links against human links: AER, precision, recall and F1 (Och & Ney 2003).

**Links.** A link is a pair ``(source_index, target_index)``. One sentence's links are either

* an iterable of ``(s, t)`` pairs (a list of tuples or lists, a set, or an integer tensor ``[L, 2]``), or
* a bool tensor ``[S, T]`` (source × target, True = linked), e.g. from
  :func:`~lightning_xai.metrics.functional.extract_links`.

Every function here takes a **corpus**: a sequence with one entry of links per sentence, or a bool tensor
``[B, S, T]`` (padding False). When the prediction and the gold of a sentence are both matrices, their shapes must
match (a piece-level prediction against word-level gold is refused; pool it with
:func:`~lightning_xai.metrics.functional.pool_to_words` first). Duplicate pairs count once.

**Sure and possible links.** Annotators mark sure links S and possible links P ⊇ S (Och & Ney 2003). With the
predicted links A,

* precision = |A ∩ P| / |A|, recall = |A ∩ S| / |S|, F1 = 2·precision·recall / (precision + recall);
* AER = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|).

``possible=None`` means P = S; then AER = 1 − F1. A ``possible`` set that does not contain S is taken as P ∪ S
(a sure link is possible by definition), so AER stays in [0, 1].

**Corpus level.** As in the shared tasks (Mihalcea & Pedersen 2003) and Ding, Xu & Koehn (2019), the counts are
summed over all sentences before dividing: a micro average, not a mean of per-sentence AERs (``per_sentence=True``
gives those). Edge cases: nothing predicted (|A| = 0) gives precision 0 and, with |S| > 0, AER = 1 − 0/|S| = 1;
no sure link (|S| = 0) gives recall 0; with |A| + |S| = 0 there is nothing to score and every value is NaN (with
a warning at corpus level).
"""

from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "AlignmentCounts",
    "alignment_counts",
    "alignment_error_rate",
    "alignment_scores",
    "alignment_scores_from_counts",
    "link_set",
    "links_to_matrix",
]

#: one sentence's links: a bool ``[S, T]`` matrix, an integer ``[L, 2]`` tensor or an iterable of (s, t) pairs
Links = Union[Tensor, Iterable[Tuple[int, int]]]
#: a corpus of links: one :data:`Links` per sentence, or a bool ``[B, S, T]`` tensor
CorpusLinks = Union[Tensor, Sequence[Links]]
_Shape = Optional[Tuple[int, int]]


class AlignmentCounts(NamedTuple):
    """Per-sentence link counts ``[N]`` (int64): |A|, |S|, |A ∩ S| and |A ∩ P| (P taken as P ∪ S)."""

    predicted: Tensor
    sure: Tensor
    predicted_sure: Tensor
    predicted_possible: Tensor


def _pair(item: Any, where: str) -> Tuple[int, int]:  # any user object; unpacked and checked here
    try:
        s, t = item
        pair = (operator.index(s), operator.index(t))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {item!r} is not a (source_index, target_index) pair of ints.") from None
    if pair[0] < 0 or pair[1] < 0:
        raise ValueError(f"{where}: link {pair} has a negative index; indices count tokens from 0.")
    return pair


def _sentence(links: Links, where: str) -> Tuple[FrozenSet[Tuple[int, int]], _Shape]:
    if isinstance(links, Tensor):
        if links.dtype == torch.bool:
            if links.ndim != 2:
                raise ValueError(
                    f"{where}: a bool link matrix must be [S, T] (source × target), got shape {tuple(links.shape)}."
                )
            return frozenset(map(tuple, links.nonzero().tolist())), (links.shape[0], links.shape[1])
        if links.is_floating_point() or links.is_complex():
            raise TypeError(
                f"{where}: links are a bool [S, T] matrix or integer (source, target) pairs, got a "
                f"{links.dtype} tensor; turn a score map into links with extract_links first."
            )
        if links.numel() == 0:
            return frozenset(), None
        if links.ndim != 2 or links.shape[1] != 2:
            raise ValueError(
                f"{where}: an integer link tensor must be [L, 2] (one (source, target) pair a row), "
                f"got shape {tuple(links.shape)}."
            )
        links = links.tolist()
    if isinstance(links, (str, bytes)):
        raise TypeError(f"{where}: links must be (source, target) pairs or a bool matrix, got a string.")
    return frozenset(_pair(item, where) for item in links), None


def link_set(links: Links) -> FrozenSet[Tuple[int, int]]:
    """One sentence's links as a frozenset of ``(source_index, target_index)`` pairs.

    Example:
        >>> sorted(link_set(torch.tensor([[True, False], [True, True]])))
        [(0, 0), (1, 0), (1, 1)]
        >>> sorted(link_set([[1, 2], (0, 0), (1, 2)]))
        [(0, 0), (1, 2)]
    """
    return _sentence(links, "links")[0]


def links_to_matrix(links: Links, shape: Tuple[int, int]) -> Tensor:
    """One sentence's links as a bool ``[S, T]`` matrix of the given (source, target) shape.

    Raises:
        ValueError: a link outside ``shape``.

    Example:
        >>> links_to_matrix([(0, 1), (2, 0)], (3, 2))
        tensor([[False,  True],
                [False, False],
                [ True, False]])
    """
    pairs, _ = _sentence(links, "links")
    outside = sorted(p for p in pairs if p[0] >= shape[0] or p[1] >= shape[1])
    if outside:
        raise ValueError(f"links {outside[:5]} lie outside the {tuple(shape)} (source × target) matrix.")
    matrix = torch.zeros(tuple(shape), dtype=torch.bool)
    if pairs:
        index = torch.tensor(sorted(pairs))
        matrix[index[:, 0], index[:, 1]] = True
    return matrix


def _corpus(links: CorpusLinks, name: str) -> List[Tuple[FrozenSet[Tuple[int, int]], _Shape]]:
    if isinstance(links, Tensor):
        if links.dtype == torch.bool and links.ndim == 3:
            return [_sentence(matrix, f"{name}[{i}]") for i, matrix in enumerate(links)]
        raise ValueError(
            f"{name} must be a corpus: a sequence with one entry of links per sentence, or a bool "
            f"[B, S, T] tensor; got a {links.dtype} tensor of shape {tuple(links.shape)}. For one "
            f"sentence pass [links]."
        )
    if isinstance(links, (str, bytes)) or not isinstance(links, Iterable):
        raise TypeError(f"{name} must be a sequence with one entry of links per sentence, got {type(links).__name__}.")
    sentences = list(links)
    if sentences and not isinstance(sentences[0], Tensor) and _is_pair(sentences[0]):
        raise ValueError(
            f"{name} looks like the (source, target) pairs of one sentence; a corpus has one entry "
            f"per sentence: pass [links]."
        )
    return [_sentence(sentence, f"{name}[{i}]") for i, sentence in enumerate(sentences)]


def _is_pair(item: Any) -> bool:  # any user object; unpacked and checked here
    try:
        s, t = item
        operator.index(s), operator.index(t)
    except (TypeError, ValueError):
        return False
    return True


def alignment_counts(pred: CorpusLinks, sure: CorpusLinks, possible: Optional[CorpusLinks] = None) -> AlignmentCounts:
    """Per-sentence counts |A|, |S|, |A ∩ S|, |A ∩ P| of predicted links A against sure S and possible P ∪ S.

    Raises:
        ValueError: the corpora have different numbers of sentences, or two matrices of a sentence differ in shape.

    Example:
        >>> alignment_counts([[(0, 0), (1, 1)]], [[(0, 0), (1, 0)]], [[(0, 0), (1, 0), (1, 1)]])
        AlignmentCounts(predicted=tensor([2]), sure=tensor([2]), predicted_sure=tensor([1]), predicted_possible=tensor([2]))
    """
    corpora = {"pred": _corpus(pred, "pred"), "sure": _corpus(sure, "sure")}
    if possible is not None:
        corpora["possible"] = _corpus(possible, "possible")
    sizes = {name: len(c) for name, c in corpora.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"The corpora have different numbers of sentences: {sizes}; pass one entry per sentence to each."
        )
    rows = []
    for i in range(sizes["pred"]):
        shapes = {name: c[i][1] for name, c in corpora.items() if c[i][1] is not None}
        if len(set(shapes.values())) > 1:
            raise ValueError(
                f"Sentence {i}: the link matrices differ in shape {shapes}; they must be [S, T] over "
                "the same words (pool piece-level maps to words with pool_to_words first)."
            )
        a, s = corpora["pred"][i][0], corpora["sure"][i][0]
        p = s | corpora["possible"][i][0] if possible is not None else s
        rows.append((len(a), len(s), len(a & s), len(a & p)))
    table = torch.tensor(rows, dtype=torch.long).reshape(-1, 4)
    return AlignmentCounts(*table.unbind(1))


def alignment_scores_from_counts(
    predicted: Tensor, sure: Tensor, predicted_sure: Tensor, predicted_possible: Tensor
) -> Dict[str, Tensor]:
    """AER, precision, recall and F1 (float64) from counts of any shape; NaN where |A| + |S| = 0."""
    predicted, sure = predicted.double(), sure.double()
    predicted_sure, predicted_possible = predicted_sure.double(), predicted_possible.double()
    zero = torch.zeros_like(predicted)
    precision = torch.where(predicted > 0, predicted_possible / predicted.clamp(min=1), zero)
    recall = torch.where(sure > 0, predicted_sure / sure.clamp(min=1), zero)
    both = precision + recall
    f1 = torch.where(both > 0, 2 * precision * recall / torch.where(both > 0, both, torch.ones_like(both)), zero)
    total = predicted + sure
    aer = 1.0 - (predicted_sure + predicted_possible) / total.clamp(min=1)
    out = {"aer": aer, "precision": precision, "recall": recall, "f1": f1}
    return {key: torch.where(total > 0, value, torch.full_like(value, math.nan)) for key, value in out.items()}


def alignment_scores(
    pred: CorpusLinks, sure: CorpusLinks, possible: Optional[CorpusLinks] = None, *, per_sentence: bool = False
) -> Dict[str, Tensor]:
    """``{"aer", "precision", "recall", "f1"}`` of predicted links against sure (and possible) links.

    Corpus level (counts summed over sentences, 0-d float64 tensors) unless ``per_sentence`` (``[N]`` tensors).
    Definitions and edge cases: see the module docstring.

    Example:
        >>> pred = [[(0, 0), (1, 1), (2, 1)]]
        >>> sure, possible = [[(0, 0), (1, 2)]], [[(1, 1)]]
        >>> {k: round(float(v), 4) for k, v in alignment_scores(pred, sure, possible).items()}
        {'aer': 0.4, 'precision': 0.6667, 'recall': 0.5, 'f1': 0.5714}
    """
    counts = alignment_counts(pred, sure, possible)
    if not per_sentence:
        counts = AlignmentCounts(*(c.sum() for c in counts))
        if int(counts.predicted) + int(counts.sure) == 0:
            warnings.warn(
                "No predicted and no sure link in the whole corpus: alignment scores are undefined (NaN).",
                UserWarning,
                stacklevel=2,
            )
    return alignment_scores_from_counts(*counts)


def alignment_error_rate(
    pred: CorpusLinks, sure: CorpusLinks, possible: Optional[CorpusLinks] = None, *, per_sentence: bool = False
) -> Tensor:
    """Och & Ney's alignment error rate, AER = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|), lower is better.

    ``possible=None`` means P = S (then AER = 1 − F1); a ``possible`` corpus is taken as P ∪ S. Corpus level
    (counts summed over sentences) unless ``per_sentence``.

    Example:
        >>> sure = [[(0, 0), (1, 1)], [(0, 1)]]
        >>> round(float(alignment_error_rate([[(0, 0), (1, 0)], [(0, 1)]], sure)), 4)  # 1 − (2 + 2) / (3 + 3)
        0.3333
        >>> float(alignment_error_rate([[], []], sure))  # nothing predicted: 1 − 0 / |S|
        1.0
    """
    return alignment_scores(pred, sure, possible, per_sentence=per_sentence)["aer"]

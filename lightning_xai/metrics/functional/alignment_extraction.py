"""From a soft source × target score map (cross-attention, saliency) to hard word-alignment links.

* :func:`extract_links` turns a ``[S, T]`` (or batched ``[B, S, T]``) score map into a bool link matrix of the
  same shape, by one of :data:`LINK_RULES`;
* :func:`pool_to_words` first pools a sub-word (piece-level) map to words, given each side's piece → word index.

Score maps are oriented **source × target** throughout (rows: source words, columns: target words), the
orientation of the link pairs ``(source_index, target_index)`` in :mod:`~lightning_xai.metrics.functional.alignment`.
A decoder's cross-attention ``[T, S]`` (one row per target position) is passed transposed.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = ["LINK_RULES", "WORD_POOLINGS", "extract_links", "pool_to_words"]

#: how :func:`extract_links` picks links
LINK_RULES = ("target_argmax", "source_argmax", "intersection", "threshold")
#: how :func:`pool_to_words` combines the pieces of a word
WORD_POOLINGS = ("sum", "mean", "max")

_Flags = Union[Tensor, Sequence[int], Sequence[bool]]


def _describe(value: object) -> str:
    return f"{value.dtype} {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__


def _flags(value: Optional[_Flags], shape: tuple, name: str, device: torch.device) -> Optional[Tensor]:
    if value is None:
        return None
    flags = torch.as_tensor(value, device=device)
    if flags.is_floating_point():
        raise TypeError(f"{name} must be bool or 0/1 integers, got {flags.dtype}.")
    if tuple(flags.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(flags.shape)} but the score map needs {tuple(shape)}.")
    return flags.bool()


def extract_links(
    scores: Tensor,
    rule: str = "target_argmax",
    *,
    threshold: Optional[float] = None,
    target_exclude: Optional[_Flags] = None,
    source_mask: Optional[_Flags] = None,
    target_mask: Optional[_Flags] = None,
) -> Tensor:
    """Bool links ``[S, T]`` (or ``[B, S, T]``) from a source × target score map.

    Rules (:data:`LINK_RULES`):

    * ``"target_argmax"``: each target word is linked to its highest-scoring source word (Ding, Xu & Koehn 2019:
      one link per target word, as in attention-based alignment);
    * ``"source_argmax"``: each source word is linked to its highest-scoring target word;
    * ``"intersection"``: the links both argmax rules agree on (higher precision, lower recall);
    * ``"threshold"``: every pair with score ≥ ``threshold`` (many-to-many).

    Target words marked in ``target_exclude`` (e.g. the corpus's ``target_exclude``: punctuation the annotators did
    not align) get no link and are never an argmax candidate; ``source_mask`` / ``target_mask`` (True at real
    words, ``[S]``/``[T]`` or ``[B, S]``/``[B, T]``) leave padding out the same way. Ties go to the lower index.

    Raises:
        ValueError: an unknown rule, ``threshold`` missing for (or given to another) rule, a shape mismatch, or a
            NaN/inf score at a candidate pair.

    Example:
        >>> scores = torch.tensor([[0.7, 0.1, 0.2],
        ...                        [0.3, 0.9, 0.8]])
        >>> extract_links(scores, target_exclude=[0, 0, 1]).int()  # target word 2 (say ".") is not aligned
        tensor([[1, 0, 0],
                [0, 1, 0]], dtype=torch.int32)
        >>> extract_links(scores, "source_argmax").int()
        tensor([[1, 0, 0],
                [0, 1, 0]], dtype=torch.int32)
        >>> extract_links(scores, "threshold", threshold=0.5).int()
        tensor([[1, 0, 0],
                [0, 1, 1]], dtype=torch.int32)
    """
    if rule not in LINK_RULES:
        raise ValueError(f"Unknown link rule {rule!r}; choose one of {', '.join(LINK_RULES)}.")
    if rule == "threshold" and threshold is None:
        raise ValueError("rule='threshold' needs threshold= (the links are the pairs scoring >= threshold).")
    if rule != "threshold" and threshold is not None:
        raise ValueError(
            f"threshold= is used only by rule='threshold', not by rule={rule!r}; drop it or pass rule='threshold'."
        )
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.ndim not in (2, 3):
        raise ValueError(
            f"scores must be a floating tensor [S, T] or [B, S, T] (source × target), got {_describe(scores)}."
        )
    single = scores.ndim == 2
    batch = scores.unsqueeze(0) if single else scores
    B, S, T = batch.shape
    lead = () if single else (B,)

    def side(value: Optional[_Flags], size: int, name: str, default: bool) -> Tensor:
        flags = _flags(value, lead + (size,), name, batch.device)
        if flags is None:
            flags = torch.full((B, size), default, dtype=torch.bool, device=batch.device)
        return flags.reshape(B, size)

    source_real = side(source_mask, S, "source_mask", True)
    target_aligned = side(target_mask, T, "target_mask", True) & ~side(target_exclude, T, "target_exclude", False)
    candidate = source_real.unsqueeze(2) & target_aligned.unsqueeze(1)
    if not math.isfinite(float(batch.detach().masked_fill(~candidate, 0.0).sum())):
        raise ValueError(
            "scores has NaN or inf at a real (source, target) pair; links need finite scores (check the "
            "attribution for overflow, or replace with torch.nan_to_num)."
        )
    if rule == "threshold":
        assert threshold is not None  # checked at the top: rule='threshold' without threshold= raised
        links = (batch >= threshold) & candidate
    else:
        filled = batch.detach().masked_fill(~candidate, float("-inf"))
        per_target = torch.zeros_like(candidate).scatter_(1, filled.argmax(1, keepdim=True), True) & candidate
        per_source = torch.zeros_like(candidate).scatter_(2, filled.argmax(2, keepdim=True), True) & candidate
        links = {"target_argmax": per_target, "source_argmax": per_source, "intersection": per_target & per_source}[
            rule
        ]
    return links[0] if single else links


def _word_index(
    word_ids: Union[Tensor, Sequence[Optional[int]]], pieces: int, name: str, device: torch.device
) -> Tensor:
    if isinstance(word_ids, Tensor):
        ids = word_ids.to(device=device, dtype=torch.long)
    else:
        ids = torch.tensor([-1 if w is None else int(w) for w in word_ids], dtype=torch.long, device=device)
    if ids.ndim != 1 or ids.numel() != pieces:
        raise ValueError(f"{name} needs one word index per piece ({pieces}), got shape {tuple(ids.shape)}.")
    if (ids < -1).any():
        raise ValueError(f"{name} holds indices below -1; use -1 (or None) for pieces that belong to no word.")
    words = ids[ids >= 0]
    if words.numel():
        missing = (torch.bincount(words, minlength=int(words.max()) + 1) == 0).nonzero().flatten()
        if missing.numel():
            raise ValueError(
                f"{name}: words {missing.tolist()[:10]} have no piece; word indices must run 0..n-1 "
                "without gaps (the word_ids() of a Hugging Face tokenizer do)."
            )
    return ids


def _pool(scores: Tensor, ids: Tensor, reduce: str, dim: int) -> Tensor:
    moved = scores.movedim(dim, 0)
    keep = ids >= 0
    values, index = moved[keep], ids[keep]
    words = int(index.max()) + 1 if index.numel() else 0
    out = values.new_zeros((words,) + tuple(values.shape[1:]))
    expanded = index.view(-1, *([1] * (values.ndim - 1))).expand_as(values)
    out = out.scatter_reduce(0, expanded, values, reduce={"max": "amax"}.get(reduce, reduce), include_self=False)
    return out.movedim(0, dim)


def pool_to_words(
    scores: Tensor,
    source_words: Union[Tensor, Sequence[Optional[int]]],
    target_words: Union[Tensor, Sequence[Optional[int]]],
    *,
    source_reduce: str = "sum",
    target_reduce: str = "mean",
) -> Tensor:
    """Pool a piece-level source × target map ``[S_pieces, T_pieces]`` to words ``[S_words, T_words]``.

    ``source_words`` / ``target_words`` give each piece's word index (a Hugging Face tokenizer's ``word_ids()``);
    ``-1`` or ``None`` marks pieces of no word (special tokens, padding), which are dropped. Words are numbered
    0..n-1 with no gap.

    Defaults, and why: along the **source** axis pieces are **summed** — a cross-attention row (one target piece)
    is a distribution over source pieces, and the mass on a word is the sum over its pieces; a max would
    under-score a word the tokenizer split (its mass is spread over pieces). Along the **target** axis pieces are
    **averaged** — each target piece is its own query with its own distribution, so the mean keeps a
    distribution, and a sum would favour target words split into many pieces under ``"source_argmax"`` and
    ``"threshold"``. ``"max"`` (either axis) is the "aligned if any piece is" reading for sharp maps.

    Raises:
        ValueError: an unknown pooling, or piece indices that do not fit the map.

    Example:
        >>> scores = torch.tensor([[0.1, 0.2, 0.6],
        ...                        [0.3, 0.4, 0.2],
        ...                        [0.6, 0.4, 0.2]])
        >>> # source pieces 0 and 1 are word 0, piece 2 is </s>; target pieces 0 and 1 are word 0, piece 2 word 1
        >>> pool_to_words(scores, [0, 0, None], [0, 0, 1])  # [[mean(0.1+0.3, 0.2+0.4), 0.6+0.2]]
        tensor([[0.5000, 0.8000]])
    """
    for name, reduce in (("source_reduce", source_reduce), ("target_reduce", target_reduce)):
        if reduce not in WORD_POOLINGS:
            raise ValueError(f"Unknown {name} {reduce!r}; choose one of {', '.join(WORD_POOLINGS)}.")
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.ndim != 2:
        raise ValueError(
            f"scores must be one sentence's floating [S_pieces, T_pieces] map (source × target), got "
            f"{_describe(scores)}."
        )
    source_ids = _word_index(source_words, scores.shape[0], "source_words", scores.device)
    target_ids = _word_index(target_words, scores.shape[1], "target_words", scores.device)
    return _pool(_pool(scores, source_ids, source_reduce, 0), target_ids, target_reduce, 1)

"""Word-level views of word-piece models.

The bundled datasets are whitespace-tokenised and their impermissible/rationale masks are per *word*; a
transformer reads *word-pieces* (``"unbelievable"`` -> ``"un", "##bel", "##ievable"``). ``word_ids`` ``[B, T]``
(the word each piece came from, ``-1`` on ``[CLS]``/``[SEP]``/pads — what
:class:`lightning_xai.data.hf.WordPieceCollator` puts in every batch) connects the two:

* :func:`words_to_pieces` spreads word values onto pieces: every piece inherits its word's value (a piece of an
  impermissible word is impermissible; a piece of a rationale word is rationale).
* :func:`pieces_to_words` aggregates piece scores back to words by **summing** the scores of a word's pieces.
  Sums keep a distribution a distribution (attention over pieces -> attention over words, still summing to 1) and
  keep additive attributions additive (Integrated Gradients' completeness holds per word). Compare word-level
  scores with word-level masks so that a word split into many pieces is not counted many times.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import Tensor

__all__ = ["pieces_to_words", "to_word_level", "words_to_pieces"]


def _check_word_ids(word_ids: Tensor, batch_size: int) -> None:
    if word_ids.dim() != 2 or word_ids.shape[0] != batch_size:
        raise ValueError(f"word_ids must be [B, T] with B={batch_size}; got {tuple(word_ids.shape)}.")
    if word_ids.dtype in (torch.bool, torch.float16, torch.float32, torch.float64):
        raise TypeError(f"word_ids must be an integer tensor (-1 at special tokens/pads), got {word_ids.dtype}.")


def words_to_pieces(word_values: Tensor, word_ids: Tensor) -> Tensor:
    """Give every word-piece the value of the word it came from (0/False at ``word_ids == -1``).

    Args:
        word_values: ``[B, W]`` per-word values (bool masks or scores).
        word_ids: ``[B, T]`` word index of each piece, ``-1`` at special tokens and pads.

    Returns:
        ``[B, T]`` with ``word_values``' dtype.

    Example:
        >>> import torch
        >>> words = torch.tensor([[False, True, False]])          # "the unbelievable cat"
        >>> word_ids = torch.tensor([[-1, 0, 1, 1, 1, 2, -1]])   # [CLS] the un ##bel ##ievable cat [SEP]
        >>> words_to_pieces(words, word_ids)
        tensor([[False, False,  True,  True,  True, False, False]])
    """
    _check_word_ids(word_ids, word_values.shape[0])
    if word_ids.numel() and int(word_ids.max()) >= word_values.shape[1]:
        raise ValueError(
            f"word_ids refer to word {int(word_ids.max())} but word_values has only "
            f"{word_values.shape[1]} words per row."
        )
    valid = word_ids >= 0
    gathered = torch.gather(word_values, 1, word_ids.clamp_min(0))
    return torch.where(valid, gathered, torch.zeros((), dtype=word_values.dtype, device=word_values.device))


def pieces_to_words(scores: Tensor, word_ids: Tensor, num_words: Optional[int] = None) -> Tensor:
    """Sum word-piece scores per word: ``word_score[b, w] = Σ_{t: word_ids[b, t] = w} scores[b, t]``.

    Pieces with ``word_ids == -1`` (special tokens, pads) are dropped. Words without any piece (cut off by
    truncation, or words the tokenizer maps to nothing) get 0.

    Args:
        scores: ``[B, T]`` piece scores (attention, attributions; graph-connected if they are).
        word_ids: ``[B, T]`` word index of each piece, ``-1`` at special tokens and pads.
        num_words: ``W``; defaults to the largest word index + 1.

    Returns:
        ``[B, W]`` word scores.

    Example:
        >>> import torch
        >>> scores = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.1, 0.3, 0.0]])
        >>> word_ids = torch.tensor([[-1, 0, 1, 1, 1, 2, -1]])
        >>> pieces_to_words(scores, word_ids)
        tensor([[0.1000, 0.6000, 0.3000]])
    """
    _check_word_ids(word_ids, scores.shape[0])
    if scores.shape != word_ids.shape:
        raise ValueError(
            f"scores have shape {tuple(scores.shape)} but word_ids {tuple(word_ids.shape)}; both are [B, T]."
        )
    if num_words is None:
        num_words = int(word_ids.max()) + 1 if word_ids.numel() else 0
    valid = word_ids >= 0
    index = torch.where(valid, word_ids, torch.full_like(word_ids, num_words))  # a dump column for -1
    out = scores.new_zeros(scores.shape[0], num_words + 1)
    out = out.scatter_add(1, index, scores.masked_fill(~valid, 0))
    return out[:, :num_words]


def to_word_level(scores: Tensor, batch: Mapping[str, Tensor]) -> Tensor:
    """Word-level view of piece scores of a batch from :class:`~lightning_xai.data.hf.WordPieceCollator`.

    Uses ``batch["word_ids"]`` and returns ``[B, W]`` with ``W = batch["word_mask"].shape[1]``, aligned with
    ``batch["word_mask"]``, ``batch["word_impermissible"]`` and ``batch["word_rationale"]``.

    Example:
        >>> import torch
        >>> batch = {"word_ids": torch.tensor([[-1, 0, 0, 1, -1]]), "word_mask": torch.ones(1, 2, dtype=torch.bool)}
        >>> to_word_level(torch.tensor([[0.0, 0.25, 0.25, 0.5, 0.0]]), batch)
        tensor([[0.5000, 0.5000]])
    """
    for key in ("word_ids", "word_mask"):
        if key not in batch:
            raise KeyError(
                f"Batch has no {key!r}; word-level views need batches from lightning_xai.data.hf.WordPieceCollator."
            )
    return pieces_to_words(scores, batch["word_ids"], batch["word_mask"].shape[1])

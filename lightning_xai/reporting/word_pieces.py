"""Sub-word pieces back into words for display: WordPiece ``##`` continuations, byte-level BPE ``Ġ`` word starts
and SentencePiece ``▁`` word starts. A word's score is the sum of its pieces' scores (attributions add up)."""

from __future__ import annotations

from typing import Dict, List, Mapping, Sequence, Tuple

__all__ = ["merge_word_pieces"]

_STARTS = ("Ġ", "▁")


def _is_special(piece: str) -> bool:
    return len(piece) > 2 and ((piece[0] == "[" and piece[-1] == "]") or (piece[0] == "<" and piece[-1] == ">"))


def _word_starts(tokens: Sequence[str]) -> List[bool]:
    marked = any(t.startswith(_STARTS) for t in tokens)  # a BPE/SentencePiece text: unmarked pieces continue
    starts = []
    for i, piece in enumerate(tokens):
        if i == 0 or _is_special(piece) or _is_special(tokens[i - 1]):
            starts.append(True)
        elif piece.startswith("##"):
            starts.append(False)
        elif marked:
            starts.append(piece.startswith(_STARTS))
        else:
            starts.append(True)
    return starts


def merge_word_pieces(
    tokens: Sequence[str], maps: Mapping[str, Sequence[float]]
) -> Tuple[List[str], Dict[str, List[float]]]:
    """Merge the pieces of each word into one token whose score, in every map, is the sum of its pieces' scores.

    Special tokens (``[CLS]``, ``<s>``, ...) stay alone; the markers (``##``, ``Ġ``, ``▁``) are dropped from the
    shown word. Texts without any marker come back unchanged. A NaN piece makes its word NaN.

    Example:
        >>> merge_word_pieces(["[CLS]", "un", "##believ", "##able", "film", "[SEP]"],
        ...                   {"attention": [0.0, 0.25, 0.25, 0.5, 0.4, 0.0]})
        (['[CLS]', 'unbelievable', 'film', '[SEP]'], {'attention': [0.0, 1.0, 0.4, 0.0]})
        >>> merge_word_pieces(["<s>", "Ġun", "believ", "able", "Ġfilm"], {"ig": [0.0, 1.0, 2.0, 3.0, -1.0]})
        (['<s>', 'unbelievable', 'film'], {'ig': [0.0, 6.0, -1.0]})
    """
    tokens = [str(t) for t in tokens]
    for name, scores in maps.items():
        if len(scores) != len(tokens):
            raise ValueError(f"map {name!r} has {len(scores)} scores for {len(tokens)} tokens.")
    words: List[str] = []
    merged: Dict[str, List[float]] = {name: [] for name in maps}
    for i, (piece, start) in enumerate(zip(tokens, _word_starts(tokens))):
        text = piece[2:] if piece.startswith("##") else piece[1:] if piece.startswith(_STARTS) else piece
        if start:
            words.append(text)
        else:
            words[-1] += text
        for name, scores in maps.items():
            value = float(scores[i])
            if start:
                merged[name].append(value)
            else:
                merged[name][-1] += value
    return words, merged

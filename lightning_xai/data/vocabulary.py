"""A word vocabulary built from the training split: index 0 is ``<pad>``, 1 is ``<unk>``."""

from __future__ import annotations

import numbers
from collections import Counter
from typing import Any, Iterable, List, Mapping, Optional, Sequence

__all__ = ["Vocabulary", "PAD", "UNK", "SOS", "EOS", "token_list"]

PAD, UNK, SOS, EOS = "<pad>", "<unk>", "<sos>", "<eos>"


class Vocabulary:
    """Token <-> index mapping.

    Example:
        >>> vocab = Vocabulary.build([["a", "b", "a"]], min_freq=1)
        >>> vocab.encode(["a", "zzz"]), len(vocab)
        ([4, 1], 6)
    """

    def __init__(self, itos: Sequence[str]) -> None:
        if len(itos) < 2 or itos[0] != PAD or itos[1] != UNK:
            raise ValueError(f"A vocabulary starts with {PAD!r}, {UNK!r}; got {list(itos[:2])}.")
        self.itos: List[str] = list(itos)
        self.stoi = {token: index for index, token in enumerate(self.itos)}

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_freq: int = 1) -> "Vocabulary":
        """Vocabulary of the tokens seen at least ``min_freq`` times, most frequent first (ties alphabetical)."""
        counts = Counter(token for sentence in sentences for token in sentence)
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        return cls([PAD, UNK, SOS, EOS] + [w for w in words if w not in (PAD, UNK, SOS, EOS)])

    def encode(self, tokens: Sequence[str]) -> List[int]:
        unk = self.stoi[UNK]
        return [self.stoi.get(token, unk) for token in tokens]

    def decode(self, indices: Iterable[int]) -> List[str]:
        return [self.itos[i] for i in indices]

    def __len__(self) -> int:
        return len(self.itos)


def _is_id(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def token_list(vocab: Any) -> Optional[List[str]]:
    """The token of every id, ``[token of id 0, token of id 1, ...]``, from any of the ways a vocabulary is kept.

    Accepted: ``None`` (gives ``None``); a :class:`Vocabulary` (its ``itos``); a list or tuple of tokens; a dict
    **id -> token** (int keys, or digit-string keys as JSON writes them, with str values) or **token -> id**
    (str keys, int values, e.g. a tokenizer's ``get_vocab()``) — which one is detected from the types of the
    keys and values. The ids must be 0 … n−1, each once.

    Raises:
        ValueError: a dict that is neither direction, or ids with gaps or repeats (named).

    Example:
        >>> token_list({"<pad>": 0, "good": 2, "film": 1}), token_list({0: "<pad>", 1: "film"})
        (['<pad>', 'film', 'good'], ['<pad>', 'film'])
        >>> token_list({"0": "<pad>", "1": "film"}), token_list(("<pad>", "film")), token_list(None)
        (['<pad>', 'film'], ['<pad>', 'film'], None)
        >>> token_list({"<pad>": 0, "film": 2})
        Traceback (most recent call last):
        ...
        ValueError: vocab (token -> id) must give the ids 0 … 2 each once; missing 1.
    """
    if vocab is None:
        return None
    vocab = getattr(vocab, "itos", vocab)
    if isinstance(vocab, (list, tuple)):
        return [str(token) for token in vocab]
    if not isinstance(vocab, Mapping):
        raise ValueError(
            f"vocab must be a list of tokens, a dict (id -> token or token -> id) or a Vocabulary, "
            f"got {type(vocab).__name__}."
        )
    keys, values = list(vocab), list(vocab.values())
    if all(isinstance(v, str) for v in values) and all(_is_id(k) or (isinstance(k, str) and k.isdigit()) for k in keys):
        direction, by_id = "id -> token", {int(k): str(v) for k, v in vocab.items()}
    elif all(_is_id(v) for v in values) and all(isinstance(k, str) for k in keys):
        direction, by_id = "token -> id", {int(v): str(k) for k, v in vocab.items()}
        if len(by_id) != len(vocab):
            raise ValueError(
                "vocab (token -> id) gives one id to several tokens; which token an id shows is undefined."
            )
    else:
        raise ValueError(
            "vocab is a dict but neither id -> token (int keys, str values) nor token -> id (str keys, "
            "int values); convert it to one of them or to a list of tokens."
        )
    size = max(by_id, default=-1) + 1
    missing = [i for i in range(size) if i not in by_id]
    if missing or min(by_id, default=0) < 0:
        raise ValueError(
            f"vocab ({direction}) must give the ids 0 … {size - 1} each once; missing "
            f"{', '.join(map(str, missing[:10])) or 'none, but an id is negative'}."
        )
    return [by_id[i] for i in range(size)]

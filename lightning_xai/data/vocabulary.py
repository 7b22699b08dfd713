"""A word vocabulary built from the training split: index 0 is ``<pad>``, 1 is ``<unk>``."""
from __future__ import annotations

from collections import Counter
from typing import Iterable, List, Sequence

__all__ = ["Vocabulary", "PAD", "UNK", "SOS", "EOS"]

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

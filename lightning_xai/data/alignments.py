"""The bundled parallel corpus with human word alignments: SBLGNT Greek New Testament → Berean Standard Bible.

One :class:`AlignedVerse` per verse: source (Greek) and target (English) tokens exactly as the source data has
them (not lower-cased: the links index these tokens, and casing is the caller's choice), the target tokens the
annotators excluded from alignment (punctuation and the like), and the manual links. All links are **sure**
links; the data has no "possible" links (Och & Ney's P = S), so its alignment error rate equals 1 − F1 of links.
Source, licences and split sizes: ``lightning_xai/data/bundled/bible_alignments/README.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Tuple

from lightning_xai.data.readers import _open_text, bundled_path

__all__ = ["ALIGNMENT_SPLITS", "AlignedVerse", "read_alignments"]

#: the splits of the bundled alignment corpus (train: all NT books but Mark, 1–3 John and Jude; val: 1–3 John and
#: Jude; test: Mark)
ALIGNMENT_SPLITS: Tuple[str, ...] = ("train", "val", "test")
_DATASET = "bible_alignments"


@dataclass
class AlignedVerse:
    """One verse: tokens of both sides, excluded target tokens and the sure links ``(source_index, target_index)``.

    Example:
        >>> verse = AlignedVerse("41001001", ["Ἀρχὴ"], ["Beginning", "."], [0, 1], [(0, 0)])
        >>> verse.aligned_targets
        [0]
    """

    verse: str
    source: List[str]
    target: List[str]
    target_exclude: List[int]
    sure: List[Tuple[int, int]]

    @property
    def aligned_targets(self) -> List[int]:
        """Indices of the target tokens not excluded from alignment (the ones a predicted link may point to)."""
        return [t for t, excluded in enumerate(self.target_exclude) if not excluded]


def _parse(row: dict, where: str) -> AlignedVerse:
    source, target, exclude = list(row["source"]), list(row["target"]), [int(v) for v in row["target_exclude"]]
    if len(exclude) != len(target):
        raise ValueError(f"{where}: target_exclude has {len(exclude)} values for {len(target)} target tokens.")
    sure = [(int(s), int(t)) for s, t in row["sure"]]
    bad = [(s, t) for s, t in sure if not (0 <= s < len(source) and 0 <= t < len(target))]
    if bad:
        raise ValueError(
            f"{where}: links {bad[:5]} point outside the verse ({len(source)} source, {len(target)} target tokens)."
        )
    return AlignedVerse(str(row["verse"]), source, target, exclude, sure)


def read_alignments(split: str) -> List[AlignedVerse]:
    """The verses of a split (``train``, ``val`` or ``test``) of the bundled Greek→English alignment corpus.

    Raises:
        ValueError: an unknown split.

    Example:
        >>> verses = read_alignments("val")
        >>> len(verses), verses[0].verse, verses[0].sure[:3]
        (157, '62001001', [(0, 0), (0, 1), (1, 2)])
    """
    if split not in ALIGNMENT_SPLITS:
        raise ValueError(f"The alignment corpus has no {split!r} split; choose one of {', '.join(ALIGNMENT_SPLITS)}.")
    with _open_text(bundled_path(_DATASET, f"{split}.jsonl")) as handle:
        return [
            _parse(json.loads(line), f"{_DATASET}/{split} line {n}")
            for n, line in enumerate(handle, start=1)
            if line.strip()
        ]

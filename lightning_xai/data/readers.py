"""Readers for the bundled datasets and for users' own TSV / JSONL files.

Everything is whitespace-tokenised and lower-cased so that per-token masks (Pruthi et al.'s impermissible
tokens, ERASER rationale spans) stay aligned with the tokens the model sees.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

__all__ = ["Example", "BUNDLED", "DATASET_SPLITS", "bundled_path", "read_split", "read_user_file", "jain_wallace_clean"]

BUNDLED = Path(__file__).resolve().parent / "bundled"


@dataclass
class Example:
    """One example: whitespace tokens, an integer label and optional per-token 0/1 masks."""

    tokens: List[str]
    label: int
    impermissible: Optional[List[int]] = None
    rationale: Optional[List[int]] = None


def _open_text(path: Path) -> io.TextIOBase:
    path = Path(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def bundled_path(dataset: str, filename: str) -> Path:
    return BUNDLED / dataset / f"{filename}.gz"


def _check_mask(mask: List[int], tokens: List[str], where: str) -> List[int]:
    if len(mask) != len(tokens):
        raise ValueError(
            f"{where}: the mask has {len(mask)} values but the text has {len(tokens)} whitespace "
            "tokens; each mask needs one 0/1 per token."
        )
    return mask


def _read_sst2(split: str) -> List[Example]:
    with _open_text(bundled_path("sst2", f"{split}.tsv")) as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [Example(row["sentence"].lower().split(), int(row["label"])) for row in rows]


def _pruthi_reader(task: str, labels: Dict[str, int]) -> Callable[[str], List[Example]]:
    def read(split: str) -> List[Example]:
        examples = []
        with (
            _open_text(bundled_path(task, f"{split}.txt")) as text,
            _open_text(bundled_path(task, f"{split}.txt.block")) as block,
        ):
            for line_no, (line, mask_line) in enumerate(zip(text, block), start=1):
                label, sentence = line.rstrip("\n").split("\t", 1)
                tokens = sentence.strip().lower().split()
                mask = _check_mask([int(v) for v in mask_line.split()], tokens, f"{task}/{split} line {line_no}")
                examples.append(Example(tokens, labels[label], impermissible=mask))
        return examples

    return read


_ERASER_LABELS = {"NEG": 0, "POS": 1}


def _read_eraser_movies(split: str) -> List[Example]:
    with _open_text(bundled_path("eraser_movies", "docs.jsonl")) as handle:
        docs = {doc["docid"]: doc["text"] for doc in map(json.loads, handle)}
    examples = []
    with _open_text(bundled_path("eraser_movies", f"{split}.jsonl")) as handle:
        for annotation in map(json.loads, handle):
            text = docs[annotation["annotation_id"]]
            tokens = [tok for line in text.split("\n") if line for tok in line.split()]
            rationale = [0] * len(tokens)
            for group in annotation["evidences"]:
                for span in group:
                    for i in range(span["start_token"], span["end_token"]):
                        rationale[i] = 1
            examples.append(
                Example([t.lower() for t in tokens], _ERASER_LABELS[annotation["classification"]], rationale=rationale)
            )
    return examples


# dataset -> (split name -> file stem), reader, label names
DATASET_SPLITS: Dict[str, Dict[str, str]] = {
    "sst2": {"train": "train", "val": "dev", "test": "test"},
    "sst_wiki": {"train": "train", "val": "dev", "test": "test"},
    "pronoun": {"train": "train", "val": "dev", "test": "test"},
    "occupation": {"val": "dev", "test": "test"},
    "eraser_movies": {"train": "train", "val": "val", "test": "test"},
}
_READERS: Dict[str, Callable[[str], List[Example]]] = {
    "sst2": _read_sst2,
    "sst_wiki": _pruthi_reader("sst_wiki", {"0": 0, "1": 1}),
    # Pruthi's BERT data codes M -> 0, F -> 1; we keep that coding.
    "pronoun": _pruthi_reader("pronoun", {"M": 0, "F": 1}),
    "occupation": _pruthi_reader("occupation", {"0": 0, "1": 1}),
    "eraser_movies": _read_eraser_movies,
}
LABEL_NAMES: Dict[str, List[str]] = {
    "sst2": ["negative", "positive"],
    "sst_wiki": ["negative", "positive"],
    "pronoun": ["male", "female"],
    "occupation": ["physician", "surgeon"],
    "eraser_movies": ["negative", "positive"],
}


def read_split(dataset: str, split: str) -> List[Example]:
    """Examples of a bundled dataset's split (``train``, ``val`` or ``test``)."""
    if dataset not in _READERS:
        raise ValueError(
            f"Unknown dataset {dataset!r}; bundled datasets: {', '.join(sorted(_READERS))}. "
            "For your own data pass train_path/val_path/test_path (TSV or JSONL)."
        )
    stems = DATASET_SPLITS[dataset]
    if split not in stems:
        raise ValueError(f"Dataset {dataset!r} has no {split!r} split (it has: {', '.join(stems)}).")
    return _READERS[dataset](stems[split])


def read_user_file(
    path: Union[str, Path],
    text_column: str = "sentence",
    label_column: str = "label",
    label_to_index: Optional[Dict[str, int]] = None,
) -> List[Example]:
    """Read a TSV (header row) or JSONL file of labelled texts.

    JSONL rows may also carry ``impermissible`` / ``rationale`` lists of 0/1, one per whitespace token.
    String labels are mapped with ``label_to_index``; integer-looking labels are used as they are.
    """
    file_path = Path(path)
    if not file_path.exists():
        raise FileNotFoundError(f"Data file {file_path} does not exist.")
    if file_path.name.endswith((".jsonl", ".jsonl.gz", ".json")):
        with _open_text(file_path) as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    else:
        with _open_text(file_path) as handle:
            rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    examples = []
    for line_no, row in enumerate(rows, start=1):
        for column in (text_column, label_column):
            if column not in row:
                raise ValueError(
                    f"{file_path} row {line_no} has no {column!r} column (it has {sorted(row)}); set "
                    f"text_column/label_column to the names your file uses."
                )
        tokens = str(row[text_column]).strip().lower().split()
        raw = str(row[label_column]).strip()
        if label_to_index is not None and raw in label_to_index:
            label = label_to_index[raw]
        elif re.fullmatch(r"-?\d+", raw):
            label = int(raw)
        else:
            raise ValueError(f"{file_path} row {line_no}: label {raw!r} is not an integer and not a known label name.")
        masks = {
            key: _check_mask([int(v) for v in row[key]], tokens, f"{file_path} row {line_no} '{key}'")
            for key in ("impermissible", "rationale")
            if key in row
        }
        examples.append(Example(tokens, label, **masks))
    return examples


_BRACKETS = {"-lrb-", "-rrb-", "-lsb-", "-rsb-", "-lcb-", "-rcb-"}


def jain_wallace_clean(example: Example) -> Example:
    """Jain & Wallace's SST cleaning: drop bracket tokens, turn non-word characters into spaces.

    Sub-tokens inherit their source token's mask values, so masks stay aligned.

    Example:
        >>> jain_wallace_clean(Example(["it", "is", "n't", "-lrb-", "good", "."], 0)).tokens
        ['it', 'is', 'n', 't', 'good']
    """
    tokens: List[str] = []
    keep: List[int] = []
    for i, token in enumerate(example.tokens):
        if token in _BRACKETS:
            continue
        for piece in re.sub(r"\W", " ", token).split():
            tokens.append(piece)
            keep.append(i)

    def remap(mask: Optional[List[int]]) -> Optional[List[int]]:
        return None if mask is None else [mask[i] for i in keep]

    return Example(tokens, example.label, remap(example.impermissible), remap(example.rationale))

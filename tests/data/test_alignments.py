"""The bundled Greek→English alignment corpus: the package's copy matches its README's table and checks."""

from __future__ import annotations

import configparser
import fnmatch
import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest

from lightning_xai.data import ALIGNMENT_SPLITS, AlignedVerse, read_alignments
from lightning_xai.data.readers import BUNDLED

README = BUNDLED / "bible_alignments" / "README.md"

# split -> (verses, source tokens, target tokens, links), the README's table
COUNTS = {
    "train": (7102, 123315, 180063, 169791),
    "val": (157, 3049, 4237, 4000),
    "test": (673, 11286, 16631, 15682),
}


def _readme_table():
    rows = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in COUNTS and len(cells) == 6:
            rows[cells[0]] = tuple(int(c.replace(",", "")) for c in cells[2:])
    return rows


def test_readme_table_is_the_one_checked_here():
    assert _readme_table() == COUNTS


@pytest.mark.parametrize("split", ALIGNMENT_SPLITS)
def test_split_counts_match_the_readme(split):
    verses = read_alignments(split)
    counts = (
        len(verses),
        sum(len(v.source) for v in verses),
        sum(len(v.target) for v in verses),
        sum(len(v.sure) for v in verses),
    )
    assert counts == COUNTS[split]


@pytest.mark.parametrize("split", ALIGNMENT_SPLITS)
def test_bundled_file_is_the_documented_one(split):
    """The SHA-256 in the README is of the uncompressed file the package ships."""
    digest = hashlib.sha256(gzip.open(BUNDLED / "bible_alignments" / f"{split}.jsonl.gz").read()).hexdigest()
    documented = re.search(rf"\| {split}\.jsonl \| ([0-9a-f]{{64}}) \|", README.read_text(encoding="utf-8"))
    assert documented is not None and documented.group(1) == digest


def test_links_are_sure_inside_the_verse_and_never_on_excluded_tokens():
    verses = read_alignments("test")
    for verse in verses:
        assert isinstance(verse, AlignedVerse)
        assert len(verse.target_exclude) == len(verse.target)
        assert len(set(verse.sure)) == len(verse.sure)  # no duplicate link
        assert all(not verse.target_exclude[t] for _, t in verse.sure)
        assert set(verse.aligned_targets) == {t for t in range(len(verse.target)) if not verse.target_exclude[t]}
    first = verses[0]  # Mark 1:1, read by hand from the file
    assert first.verse == "41001001"
    assert first.source == ["Ἀρχὴ", "τοῦ", "εὐαγγελίου", "Ἰησοῦ", "χριστοῦ"]
    assert first.target[:4] == ["This", "is", "the", "beginning"]  # case kept
    assert first.target_exclude[10] == 1 and first.target[10] == ","
    assert first.sure[:4] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert all(v.verse.startswith("41") for v in verses)  # test = Mark


def test_the_splits_hold_disjoint_books():
    books = {split: {v.verse[:2] for v in read_alignments(split)} for split in ("val", "test")}
    assert books["test"] == {"41"}
    assert books["val"] == {"62", "63", "64", "65"}


def test_unknown_split_names_the_choices():
    with pytest.raises(ValueError, match="train, val, test"):
        read_alignments("dev")


def test_a_link_outside_the_verse_is_refused(tmp_path, monkeypatch):
    row = {"verse": "1", "source": ["a"], "target": ["b"], "target_exclude": [0], "sure": [[0, 3]]}
    (tmp_path / "bible_alignments").mkdir()
    with gzip.open(tmp_path / "bible_alignments" / "val.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
    monkeypatch.setattr("lightning_xai.data.readers.BUNDLED", tmp_path)
    with pytest.raises(ValueError, match="outside the verse"):
        read_alignments("val")


def test_the_package_data_patterns_ship_the_corpus():
    setup = configparser.ConfigParser()
    setup.read(Path(__file__).resolve().parents[2] / "setup.cfg")
    patterns = [p.strip() for p in setup["options.package_data"]["lightning_xai.data"].split(",")]
    files = sorted((BUNDLED / "bible_alignments").iterdir())
    assert {f.name for f in files} == {"README.md", "train.jsonl.gz", "val.jsonl.gz", "test.jsonl.gz"}
    for path in files:
        relative = path.relative_to(BUNDLED.parent).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative

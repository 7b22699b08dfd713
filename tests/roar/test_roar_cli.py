"""``lightning-xai-roar`` on a slice of real SST-2: the console script is installed and ``main`` writes the table
and JSON whose accuracies are those of the retrained models (in [0, 1], one per ranking × fraction × seed)."""

from __future__ import annotations

import json

from lightning_xai.data import read_split
from lightning_xai.roar.cli import main


def test_roar_cli_writes_table_and_json(tmp_path):
    paths = []
    for split, n in (("train", 120), ("val", 32), ("test", 48)):
        path = tmp_path / f"{split}.tsv"
        rows = ["sentence\tlabel"] + [f"{' '.join(e.tokens)}\t{e.label}" for e in read_split("sst2", split)[:n]]
        path.write_text("\n".join(rows) + "\n")
        paths += [f"--{split}-path", str(path)]
    out = tmp_path / "runs" / "roar"
    payload = main(
        [
            *paths,
            "--rankings",
            "attention",
            "random",
            "--fractions",
            "0.5",
            "--seeds",
            "0",
            "--epochs",
            "1",
            "--embedding-dim",
            "8",
            "--hidden-dim",
            "4",
            "--out",
            str(out),
        ]
    )
    written = json.loads(out.with_suffix(".json").read_text())
    assert written["accuracy"] == json.loads(json.dumps(payload["accuracy"]))
    assert set(written["accuracy"]) == {"attention", "random"}
    for per in written["accuracy"].values():
        assert list(per) == ["0.5"] and all(0.0 <= a <= 1.0 for a in per["0.5"].values())
    table = out.with_suffix(".md").read_text()
    assert table.startswith("| ranking | 0% | 50% |") and "| attention |" in table and "| random |" in table


def test_roar_console_script_registered():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("lightning-xai-roar") == "lightning_xai.roar.cli:run"  # exits 0 once main has run

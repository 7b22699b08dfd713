"""Shared ending of the issue-17 example scripts: print a Markdown table and the wall time, optionally save JSON."""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable, Dict, List, Sequence


def report(
    args: argparse.Namespace,
    rows: List[Dict],
    header: Sequence[str],
    cells: Callable[[Dict], Sequence[str]],
    started: float,
) -> None:
    """Print ``rows`` as a Markdown table (``cells(row)`` gives one row's cells) and save them to ``args.json``."""
    print("| " + " | ".join(header) + " |")
    print("|---" * len(header) + "|")
    for row in rows:
        print("| " + " | ".join(cells(row)) + " |")
    print(f"total {time.perf_counter() - started:.0f} s")
    if getattr(args, "json", None):
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "rows": rows}, handle, indent=2)


def parse_args(doc: str, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The script's ``parser`` plus ``--seed`` and ``--json``, parsed; torch on one thread."""
    import torch

    parser.description = doc.split("\n")[0]
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    return args

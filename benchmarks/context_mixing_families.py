"""Which transformer families each context-mixing method runs on: the README's table, measured.

Every context-mixing method of ``attribute`` on the tiny random family configs of
``tests/adapters/test_families.py`` (2 layers, hidden 32, fp64, a padded batch of three rows; right padding for
encoders, left for decoders). A cell is ✓ when the map is finite and not all zero (AttnLRP: with its conservation
delta), or the error the method raises.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/context_mixing_families.py``
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

METHODS = ("attention_norm", "value_zeroing", "alti", "attention_flow", "grad_attention", "attnlrp")


def cell(adapter, batch, method: str) -> str:
    from lightning_xai.attribution import attribute

    options = {"return_convergence_delta": True} if method == "attnlrp" else {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = attribute(adapter, batch, method, target=batch["labels"], **options)
    except Exception as error:  # the table reports what the method raises
        return f"✗ {type(error).__name__}"
    scores, note = (out[0], f" (δ {float(out[1].abs().max()):.0e})") if isinstance(out, tuple) else (out, "")
    ok = bool(torch.isfinite(scores).all()) and float(scores.abs().sum()) > 0
    return ("✓" if ok else "✗ degenerate") + note


def main() -> str:
    from lightning_xai.adapters import HuggingFaceAdapter
    from tests.adapters.test_families import DECODERS, ENCODERS, family_batch, family_model

    lines = ["| family | " + " | ".join(f"`{m}`" for m in METHODS) + " |", "|---" * (len(METHODS) + 1) + "|"]
    for name in (*ENCODERS, *DECODERS):
        adapter = HuggingFaceAdapter(family_model(name))
        batch = family_batch(name, left=name in DECODERS)
        lines.append(f"| {name} | " + " | ".join(cell(adapter, batch, m) for m in METHODS) + " |")
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()

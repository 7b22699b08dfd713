"""``lightning-xai-roar``: remove-and-retrain from the command line.

    lightning-xai-roar --rankings attention random --fractions 0.1 0.5 0.9 --seeds 0 1 --out runs/roar_sst2

Ranks every train/val/test token once with a base model, masks the top share of each sentence, retrains a fresh
:class:`~lightning_xai.models.AttentionClassifier` per (ranking, fraction, seed) and writes the Markdown table
(``<out>.md``) and the accuracies (``<out>.json``). ``--train-path``/``--val-path``/``--test-path`` take the user's
own TSV files instead of the bundled ``--dataset``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from lightning_xai.data import TextClassificationDataModule
from lightning_xai.models import AttentionClassifier
from lightning_xai.roar.procedure import DEFAULT_FRACTIONS, remove_and_retrain

__all__ = ["build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lightning-xai-roar``.

    Example:
        >>> build_parser().parse_args(["--fractions", "0.5"]).fractions
        [0.5]
    """
    parser = argparse.ArgumentParser(
        prog="lightning-xai-roar", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="sst2", help="bundled data set (ignored with --train-path)")
    parser.add_argument("--train-path")
    parser.add_argument("--val-path")
    parser.add_argument("--test-path")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rankings", nargs="+", default=["attention", "gradient", "leave_one_out", "random"])
    parser.add_argument("--fractions", nargs="+", type=float, default=list(DEFAULT_FRACTIONS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--limit-val-batches", type=float, default=1.0)
    parser.add_argument("--embedding-dim", type=int, default=32)
    parser.add_argument("--hidden-dim", type=int, default=16)
    parser.add_argument("--mode", choices=["unk", "delete"], default="unk")
    parser.add_argument("--out", default="roar", help="output prefix: writes <out>.md and <out>.json")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run remove-and-retrain with the parsed arguments, print and write the results, return the JSON payload."""
    args = build_parser().parse_args(argv)
    paths = {"train_path": args.train_path, "val_path": args.val_path, "test_path": args.test_path}
    dm = TextClassificationDataModule(args.dataset, batch_size=args.batch_size, seed=0, **paths)
    dm.setup("fit")

    def make() -> AttentionClassifier:
        return AttentionClassifier(
            dm.vocab_size,
            dm.num_classes,
            embedding_dim=args.embedding_dim,
            hidden_dim=args.hidden_dim,
            embedding_std=0.3,
        )

    limit_val = int(args.limit_val_batches) if args.limit_val_batches > 1 else args.limit_val_batches
    start = time.time()
    result = remove_and_retrain(
        dm,
        make,
        rankings=args.rankings,
        fractions=args.fractions,
        seeds=args.seeds,
        mode=args.mode,
        trainer_kwargs={"max_epochs": args.epochs, "num_sanity_val_steps": 0, "limit_val_batches": limit_val},
        method_options={"gradient": {"detach_attention": True}} if "gradient" in args.rankings else None,
        on_result=lambda r, f, s, a: print(f"{r:>15} {f:4.0%} seed {s}: test acc {a:.3f}", flush=True),
    )
    elapsed = time.time() - start
    table = result.table()
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "args": vars(args),
        "seconds": elapsed,
        "base_accuracy": result.base_accuracy,
        "accuracy": {r: {str(f): v for f, v in per.items()} for r, per in result.accuracy.items()},
    }
    out.with_suffix(".json").write_text(json.dumps(payload, indent=2))
    out.with_suffix(".md").write_text(table + "\n")
    return payload


def run() -> None:
    """The ``lightning-xai-roar`` console script: :func:`main` on ``sys.argv``, exit status 0 once it has run
    (``sys.exit`` would print the payload :func:`main` returns and exit with 1).

    Example:
        >>> from unittest import mock
        >>> with mock.patch("lightning_xai.roar.cli.main", return_value={"accuracy": {}}):
        ...     print(run())
        None
    """
    main()


if __name__ == "__main__":
    run()

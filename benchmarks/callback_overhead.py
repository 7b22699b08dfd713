"""What does auditing cost? One SST-2 training epoch of the reference model, with and without AttentionAudit.

The reference model (embedding 300, BiLSTM 128/direction over packed sequences, tanh attention, batch 32) trains
one epoch on the bundled SST-2 train split (6,920 sentences) and validates on dev (872), in a real ``Trainer``.
Configurations, each in its own ``Trainer.fit`` from the same initial weights, run round-robin (order rotated
each round) so that load from other processes on this shared machine hits all of them alike:

* ``default``: ``AttentionAudit()`` at its defaults — every epoch, 256 dev sentences, gradient, grad×input and
  leave-one-out, Kendall τ / JSD / top-k overlap for every pair;
* ``ig_auto`` / ``ig50``: the defaults plus Integrated Gradients (adaptive quadrature / 50 steps), opt-in;
* cheaper configurations (``--configs``), and a run without any callback (``--plain``) as a cross-check.

In every audited run the audit's own time is measured directly (``run_audit`` wrapped with a clock, split per
attribution method), and so are the training steps and the validation pass; the overhead is
audit time / (training + validation time) of the same run, which load drifting between runs does not skew. On a
loaded machine ``--train-batches N`` times only N training batches and scales their time to the full epoch.

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/callback_overhead.py            # full epochs
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/callback_overhead.py --train-batches 40   # loaded machine
    .venv/bin/python benchmarks/callback_overhead.py --quick                      # smoke run (tiny slices)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

sys.path.insert(0, str(ROOT))
from benchmarks import harness as H  # noqa: E402

#: name -> AttentionAudit keyword arguments
CONFIGS: Dict[str, Dict[str, Any]] = {
    "default": {},
    "ig_auto": {
        "methods": ("gradient", "grad_x_input", "leave_one_out", "integrated_gradients"),
        "method_options": {"integrated_gradients": {"n_steps": "auto"}},
    },
    "ig50": {"methods": ("gradient", "grad_x_input", "leave_one_out", "integrated_gradients")},
    "jw": {"methods": ("grad_x_input", "leave_one_out"), "metrics": ("kendall_tau",)},
    "every2": {"every_n_epochs": 2},
}


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny slices and model, one round")
    parser.add_argument("--rounds", type=int, default=2, help="round-robin rounds (each config once per round)")
    parser.add_argument(
        "--configs",
        nargs="*",
        default=["default", "ig_auto", "jw"],
        choices=sorted(CONFIGS),
        help="audited configurations besides 'plain'",
    )
    parser.add_argument("--plain", action="store_true", help="also time a run without any callback")
    parser.add_argument(
        "--train-batches",
        type=int,
        default=None,
        help="time only this many training batches and extrapolate the epoch (loaded machines)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default $OMP_NUM_THREADS or 2)")
    parser.add_argument("--out", type=Path, default=None, help="result JSON (default benchmarks/results/...)")
    parser.add_argument("--no-update-readme", action="store_true", help="do not paste the table into README.md")
    return parser.parse_args(argv)


def _datamodule(quick: bool):
    from lightning_xai.data import TextClassificationDataModule

    class Sliced(TextClassificationDataModule):
        def examples(self, split):
            examples = super().examples(split)
            return examples[: {"train": 96, "val": 48, "test": 48}[split]] if quick else examples

    dm = Sliced("sst2", batch_size=32, seed=0)
    dm.setup("fit")
    return dm


def _run(config: Optional[str], dm, initial_state, quick: bool, train_batches: Optional[int]) -> Dict[str, Any]:
    import pytorch_lightning as pl

    import lightning_xai.callbacks.attention_audit as audit_module
    from lightning_xai.callbacks import AttentionAudit
    from lightning_xai.models import AttentionClassifier

    dims = dict(embedding_dim=16, hidden_dim=8) if quick else {}
    model = AttentionClassifier(dm.vocab_size, 2, **dims)
    model.load_state_dict(initial_state)
    clock: Dict[str, float] = {"audit": 0.0}
    per_method: Dict[str, float] = {}
    callbacks = []
    original_attribute = audit_module.attribute
    if config is not None:
        options = dict(CONFIGS[config])
        if quick:
            options.setdefault("num_samples", 16)
        audit = AttentionAudit(**options)
        inner = audit.run_audit

        def timed_run_audit(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                clock["audit"] += time.perf_counter() - start

        def timed_attribute(model, batch, method, *args, **kwargs):
            start = time.perf_counter()
            try:
                return original_attribute(model, batch, method, *args, **kwargs)
            finally:
                per_method[method] = per_method.get(method, 0.0) + time.perf_counter() - start

        audit.run_audit = timed_run_audit
        audit_module.attribute = timed_attribute
        callbacks.append(audit)

    class EpochClock(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            clock["epoch_start"] = time.perf_counter()

        def on_validation_start(self, trainer, pl_module):
            clock["val_start"] = time.perf_counter()
            clock["train"] = clock["val_start"] - clock["epoch_start"]

        def on_train_epoch_end(self, trainer, pl_module):  # after the epoch's validation (and audit)
            clock["epoch"] = time.perf_counter() - clock["epoch_start"]
            clock["val"] = time.perf_counter() - clock["val_start"] - clock["audit"]

    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[*callbacks, EpochClock()],
        limit_train_batches=train_batches,
        default_root_dir=str(HERE / ".cache" / "callback_overhead"),
    )
    try:
        trainer.fit(model, dm)
    finally:
        audit_module.attribute = original_attribute
    full_batches = len(dm.train_dataloader())
    ran = trainer.num_training_batches
    # the epoch without the audit: training steps (extrapolated to the full split when limited) + validation
    epoch = clock["train"] * full_batches / ran + clock["val"]
    return {
        "config": config or "plain",
        "epoch_s": epoch,
        "audit_s": clock["audit"],
        "train_s": clock["train"],
        "val_s": clock["val"],
        "train_batches": ran,
        "full_batches": full_batches,
        "per_method_s": per_method,
    }


def _markdown(result: Dict[str, Any]) -> str:
    rows = result["configs"]
    any_row = next(iter(rows.values()))
    limited = any_row["train_batches"] < any_row["full_batches"]
    lines = [
        (
            "Quick smoke run (tiny slices)."
            if result["quick"]
            else f"Measured {result['date']} on {result['machine']}, {result['threads']} torch threads, load average "
            f"{result['load_average']} at the start (a shared machine: absolute times are inflated, the ratio is the "
            f"figure); {result['rounds']} round(s), medians. Epoch = 6,920 train sentences (batch 32) + 872 dev, "
            "reference model (300-d embeddings, BiLSTM 128/direction, tanh attention)."
            + (
                f" Training time measured on {any_row['train_batches']} of {any_row['full_batches']} batches and "
                "scaled to the full epoch."
                if limited
                else ""
            )
        ),
        "",
        "| configuration | epoch without audit (s) | audit (s) | overhead (audit / epoch) | per method (s) |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        methods = ", ".join(f"{m} {t:.1f}" for m, t in sorted(row.get("per_method_s", {}).items()))
        if name == "plain":
            lines.append(f"| plain (no callback) | {row['median_epoch_s']:.1f} | — | — | |")
            continue
        label = "AttentionAudit() defaults" if not CONFIGS[name] else f"AttentionAudit(**{CONFIGS[name]})"
        lines.append(
            f"| `{name}`: {label} | {row['median_epoch_s']:.1f} | {row['median_audit_s']:.1f} | "
            f"{100 * row['overhead_within_run']:.1f} % | {methods} |"
        )
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = _parse(argv)
    import pytorch_lightning as pl
    import torch

    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    from lightning_xai.models import AttentionClassifier

    dm = _datamodule(args.quick)
    pl.seed_everything(0, verbose=False)
    dims = dict(embedding_dim=16, hidden_dim=8) if args.quick else {}
    initial = AttentionClassifier(dm.vocab_size, 2, **dims).state_dict()
    names: List[Optional[str]] = ([None] if args.plain else []) + list(args.configs)
    rounds = 1 if args.quick else args.rounds
    runs: List[Dict[str, Any]] = []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            run = _run(name, dm, initial, args.quick, args.train_batches)
            runs.append(run)
            print(
                f"round {r}: {run['config']:>14}: epoch {run['epoch_s']:.1f} s, audit {run['audit_s']:.1f} s "
                f"{run['per_method_s']}",
                flush=True,
            )
    configs: Dict[str, Dict[str, Any]] = {}
    for name in (["plain"] if args.plain else []) + list(args.configs):
        mine = [r for r in runs if r["config"] == name]
        epoch = statistics.median(r["epoch_s"] for r in mine)
        audit = statistics.median(r["audit_s"] for r in mine)
        row = {
            "median_epoch_s": epoch,
            "median_audit_s": audit,
            "runs": mine,
            "train_batches": mine[0]["train_batches"],
            "full_batches": mine[0]["full_batches"],
        }
        if name != "plain":
            row["overhead_within_run"] = statistics.median(r["audit_s"] / r["epoch_s"] for r in mine)
            methods = sorted({m for r in mine for m in r["per_method_s"]})
            row["per_method_s"] = {m: statistics.median(r["per_method_s"].get(m, 0.0) for r in mine) for m in methods}
        configs[name] = row
    result = {
        "benchmark": "callback_overhead",
        "quick": args.quick,
        "rounds": rounds,
        "threads": threads,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": round(load, 1),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}",
        "configs": configs,
    }
    result["markdown"] = _markdown(result)
    out = args.out or RESULTS / ("callback_overhead_quick.json" if args.quick else "callback_overhead.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(result["markdown"])
    if not args.quick and not args.no_update_readme:
        pasted = H.update_block("results:callback_overhead", result["markdown"])
        print("README updated" if pasted else "no callback_overhead block in README.md")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)

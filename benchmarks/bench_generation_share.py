"""What share of a training epoch do the generation audits take? The Greek→English translation model of the examples.

The word-level Marian encoder–decoder of ``examples/translation_model.py`` (its default settings: d_model 128, 3+3
layers, 4 heads) trains in one ``Trainer.fit`` on the bundled alignment corpus's train split, ``--train-batches``
token-budget batches (2,400 source+target tokens each, as the example trains) per epoch for ``--rounds`` epochs;
every epoch ends with one audit of each configuration on the val split's verses (``num_samples`` of them,
``every_n_epochs=1``, ``budget=None``), in an order rotated each epoch. Configurations, each at its defaults:

* ``attention_default``: ``AttentionAudit()`` on the generator (force decoding; agreement of each target's
  attention over the source with the default saliency maps of the summed target log-probability);
* ``alignment_default``: ``AlignmentAudit()`` (AER of the links each map induces — every layer's cross-attention
  and the default methods, per target step — against the corpus's manual links);
* ``alignment_split``: ``AlignmentAudit()`` at its default ``num_samples`` (256: the whole 157-verse val split),
  ``budget=None``: the cost of the audit a user attaching ``AlignmentAudit()`` gets first.

**At the defaults, amortised** (``--amortise-epochs``, 10): ``AlignmentAudit()`` as a user attaches it keeps
``budget=0.05``, which sizes the cadence and subset after its first audit. The callback's own budget code
(:class:`~lightning_xai.callbacks._audit.budget.AuditBudget`: ``choose`` on the first audit's measured seconds and
the epoch, ``adopt``, ``epoch_due``) schedules ``--amortise-epochs`` epochs from the measured ``alignment_split``
audit (a planned smaller subset costs its share of it, per verse); the share is every audit's seconds / every
epoch's training seconds of that run.

The epoch is the *measured* time of the limited epoch's training batches (forward, backward, optimizer step, data
loading), scaled to the full train split's batch count. The share is audit seconds / that extrapolated epoch, the
same convention as ``bench_audit_share.py``. The audit's time does not depend on how far the model has trained
(force decoding runs the reference target), so the model trains from scratch here; the AER of the *trained* model
is in ``examples/RESULTS_generation.md``.

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_generation_share.py --train-batches 20 --rounds 5
    .venv/bin/python benchmarks/bench_generation_share.py --quick                 # smoke run
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402

CONFIGS = ("attention_default", "alignment_default", "alignment_split")
TARGETS = {"attention_default": 0.05, "alignment_default": 0.05, "alignment_split": None}


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-batches", type=int, default=20, help="training batches timed per epoch")
    parser.add_argument("--rounds", type=int, default=5, help="epochs, each auditing every configuration once")
    parser.add_argument("--num-samples", type=int, default=157, help="audited val verses (157: the whole split)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time with the wall clock (default) or the process's CPU time (time.process_time: with "
        "--threads 1, what other processes on a loaded machine take is not counted)",
    )
    parser.add_argument(
        "--amortise-epochs", type=int, default=10, help="epochs of the run the default budget is amortised over"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 batches, 8 verses, 1 round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-update-readme", dest="update", action="store_false")
    return parser.parse_args(argv)


def _callbacks(names: List[str], num_samples: int) -> Dict[str, Any]:
    from lightning_xai.callbacks import AlignmentAudit, AttentionAudit

    kinds = {
        "attention_default": AttentionAudit,
        "alignment_default": AlignmentAudit,
        "alignment_split": AlignmentAudit,
    }
    sizes = {name: {} if name == "alignment_split" else {"num_samples": num_samples} for name in names}
    return {
        name: kinds[name](
            every_n_epochs=1, budget=None, log_prefix=name, on_validate=False, on_test=False, **sizes[name]
        )
        for name in names
    }


def amortised(audit_s: float, audited: int, epoch_s: float, epochs: int) -> Dict[str, Any]:
    """A run of ``epochs`` epochs of ``epoch_s`` training seconds with ``AlignmentAudit()`` at its defaults (budget
    0.05, default subset and cadence), scheduled by the callback's own budget code from a first audit of
    ``audited`` verses that took ``audit_s`` (later audits of a planned smaller subset cost its share, per verse)."""
    from lightning_xai.callbacks._audit.budget import DEFAULT_EVERY_N_EPOCHS, DEFAULT_NUM_SAMPLES, AuditBudget

    budget = AuditBudget(0.05, num_samples=DEFAULT_NUM_SAMPLES, every_n_epochs=DEFAULT_EVERY_N_EPOCHS)
    chosen = budget.choose(audit_s, epoch_s, audited)
    budget.adopt(chosen, audited, epoch=0)
    size = budget.planned_samples or audited
    audit_epochs = [0] + [e for e in range(1, epochs) if budget.epoch_due(e, int(DEFAULT_EVERY_N_EPOCHS))]
    total = audit_s + (len(audit_epochs) - 1) * audit_s * size / audited
    return {
        "epochs": epochs,
        "plan": {"num_samples": chosen.num_samples, "cadence": chosen.cadence, "share": chosen.share},
        "audit_epochs": audit_epochs,
        "audit_s_total": total,
        "train_s_total": epochs * epoch_s,
        "share": total / (epochs * epoch_s),
        "target": 0.05,
    }


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    import pytorch_lightning as pl

    args = _parse(argv)
    clock_now = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.quick:
        args.train_batches, args.rounds, args.num_samples = 2, 1, 8
    threads = H.set_threads(args.threads)
    example = M.translation_example()
    settings = example.ModelSettings()
    pl.seed_everything(settings.seed, verbose=False)
    module, data, info = M.translation_task(example, settings)
    audits = _callbacks(list(args.configs), args.num_samples)
    names = list(audits)
    clock: Dict[str, Any] = {"train": [], "audit": {n: [] for n in names}}
    for name, audit in audits.items():
        inner = audit.run_audit

        def run_audit(*a, _name=name, _inner=inner, **k):
            start = clock_now()
            try:
                return _inner(*a, **k)
            finally:
                clock["audit"][_name].append(clock_now() - start)

        audit.run_audit = run_audit

    class Rotate(pl.Callback):
        """Times the epoch's training batches, then runs the audits in a rotated order."""

        def on_train_epoch_start(self, trainer, pl_module):
            self.start = clock_now()

        def on_train_batch_end(self, trainer, pl_module, *a, **k):
            self.end = clock_now()

        def on_train_epoch_end(self, trainer, pl_module):
            clock["train"].append(self.end - self.start)
            r = trainer.current_epoch % len(names)
            for name in names[r:] + names[:r]:
                audits[name]._epoch_audit(trainer, pl_module)

    trainer = pl.Trainer(
        max_epochs=args.rounds,
        limit_train_batches=args.train_batches,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*audits.values(), Rotate()],
        gradient_clip_val=1.0,
        default_root_dir=str(H.CACHE / "generation_share"),
    )
    for audit in audits.values():  # their epoch-end audits run from Rotate instead
        audit.on_train_epoch_end = lambda *a, **k: None
    started = time.perf_counter()
    trainer.fit(module, datamodule=data)
    wall = time.perf_counter() - started
    full_batches = info["train_batches"]
    per_batch = [t / args.train_batches for t in clock["train"]]
    epoch = H.median(per_batch) * full_batches
    configs = {}
    for name in names:
        seconds = H.median(clock["audit"][name]) if clock["audit"][name] else float("nan")
        metrics = audits[name].history[-1]["metrics"] if audits[name].history else {}
        configs[name] = {
            "audit_s": seconds,
            "times": clock["audit"][name],
            "share": seconds / epoch,
            "target": TARGETS.get(name),
            "keys": len(metrics),
            "sentences": metrics.get("sentences"),
        }
    split = configs.get("alignment_split")
    defaults = None
    if split and split["sentences"]:
        defaults = amortised(split["audit_s"], int(split["sentences"]), epoch, args.amortise_epochs)
    result = {
        "model": "translation",
        "info": info,
        "env": H.environment(threads),
        "command": H.command_line(),
        "train_batches_timed": args.train_batches,
        "full_batches": full_batches,
        "rounds": args.rounds,
        "train_s_per_batch": per_batch,
        "epoch_s_extrapolated": epoch,
        "num_samples": args.num_samples,
        "configs": configs,
        "at_defaults": defaults,
        "clock": args.clock,
        "wall_s": wall,
    }
    result["markdown"] = _markdown(result)
    if not args.quick:
        path = H.save("generation_share", result, args.out)
        print(f"wrote {path}")
        if args.update:
            H.update_block("results:generation_share", result["markdown"])
    print(result["markdown"])
    return result


def _markdown(r: Dict[str, Any]) -> str:
    rows = []
    for name, c in r["configs"].items():
        target = c.get("target")
        met = None if target is None else c["share"] <= target
        rows.append(
            (
                name,
                int(c["sentences"]) if c.get("sentences") else r["num_samples"],
                c["audit_s"],
                f"{100 * c['share']:.1f}%",
                "-" if target is None else f"≤ {100 * target:.0f}%",
                "n/a" if met is None else ("yes" if met else "**no**"),
                len(c["times"]),
            )
        )
    d = r.get("at_defaults")
    if d:
        rows.append(
            (
                f"alignment at the defaults (budget 0.05: {d['plan']['num_samples']} verses every "
                f"{d['plan']['cadence']} epochs), amortised over {d['epochs']} epochs",
                d["plan"]["num_samples"],
                f"{H.fmt(d['audit_s_total'])} total",
                f"{100 * d['share']:.1f}%",
                f"≤ {100 * d['target']:.0f}%",
                "yes" if d["share"] <= d["target"] else "**no**",
                len(d["audit_epochs"]),
            )
        )
    seconds = "CPU s" if r.get("clock") == "cpu" else "s"
    text = H.table(
        rows,
        ("configuration", "val verses", f"audit {seconds} (median)", "share of epoch", "target", "met?", "runs"),
    )
    env = r["env"]
    clock = " Times in process CPU seconds (a loaded machine)." if r.get("clock") == "cpu" else ""
    if d:
        clock += (
            f" At the defaults: audits at epochs {d['audit_epochs']} of {d['epochs']}, the budget's plan from the "
            f"measured alignment_split audit and epoch."
        )
    text += (
        f"\n\nEpoch: {r['train_batches_timed']} training batches timed per round, median "
        f"{H.fmt(H.median(r['train_s_per_batch']))} {seconds}/batch × {r['full_batches']} batches = "
        f"{H.fmt(r['epoch_s_extrapolated'])} {seconds} (extrapolated to the full train split, "
        f"{r['info']['train_verses']} verses). {r['rounds']} rounds, {env['threads']} threads, 1-min load "
        f"{env['loadavg_1_5_15'][0]} ({env['utc']}).{clock} Command: `{r['command']}`"
    )
    return text


if __name__ == "__main__":
    main()

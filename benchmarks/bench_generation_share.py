"""What share of a training epoch do the generation audits take? The Greek→English translation model of the examples.

The word-level Marian encoder–decoder of ``examples/translation_model.py`` (its default settings: d_model 128, 3+3
layers, 4 heads) trains in one ``Trainer.fit`` on the bundled alignment corpus's train split, ``--train-batches``
token-budget batches (2,400 source+target tokens each, as the example trains) per epoch for ``--rounds`` epochs;
every epoch ends with one audit of each configuration on the val split's verses (``num_samples`` of them,
``every_n_epochs=1``, ``budget=None``), in an order rotated each epoch. Configurations, each at its defaults:

* ``attention_default``: ``AttentionAudit()`` on the generator (force decoding; agreement of each target's
  attention over the source with the default saliency maps of the summed target log-probability);
* ``alignment_default``: ``AlignmentAudit()`` (AER of the links each map induces — every layer's cross-attention
  and the default methods, per target step — against the corpus's manual links).

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

CONFIGS = ("attention_default", "alignment_default")
TARGETS = {"attention_default": 0.05, "alignment_default": 0.05}


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-batches", type=int, default=20, help="training batches timed per epoch")
    parser.add_argument("--rounds", type=int, default=5, help="epochs, each auditing every configuration once")
    parser.add_argument("--num-samples", type=int, default=157, help="audited val verses (157: the whole split)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 batches, 8 verses, 1 round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-update-readme", dest="update", action="store_false")
    return parser.parse_args(argv)


def _callbacks(names: List[str], num_samples: int) -> Dict[str, Any]:
    from lightning_xai.callbacks import AlignmentAudit, AttentionAudit

    kinds = {"attention_default": AttentionAudit, "alignment_default": AlignmentAudit}
    return {
        name: kinds[name](
            every_n_epochs=1, num_samples=num_samples, budget=None, log_prefix=name, on_validate=False, on_test=False
        )
        for name in names
    }


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    import pytorch_lightning as pl

    args = _parse(argv)
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
            start = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                clock["audit"][_name].append(time.perf_counter() - start)

        audit.run_audit = run_audit

    class Rotate(pl.Callback):
        """Times the epoch's training batches, then runs the audits in a rotated order."""

        def on_train_epoch_start(self, trainer, pl_module):
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, *a, **k):
            self.end = time.perf_counter()

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
        }
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
                c["audit_s"],
                f"{100 * c['share']:.1f}%",
                "-" if target is None else f"≤ {100 * target:.0f}%",
                "n/a" if met is None else ("yes" if met else "**no**"),
                len(c["times"]),
            )
        )
    text = H.table(
        rows,
        (
            f"configuration ({r['num_samples']} val verses)",
            "audit s (median)",
            "share of epoch",
            "target",
            "met?",
            "runs",
        ),
    )
    env = r["env"]
    text += (
        f"\n\nEpoch: {r['train_batches_timed']} training batches timed per round, median "
        f"{H.fmt(H.median(r['train_s_per_batch']))} s/batch × {r['full_batches']} batches = "
        f"{H.fmt(r['epoch_s_extrapolated'])} s (extrapolated to the full train split, "
        f"{r['info']['train_verses']} verses). {r['rounds']} rounds, {env['threads']} threads, 1-min load "
        f"{env['loadavg_1_5_15'][0]} ({env['utc']}). Command: `{r['command']}`"
    )
    return text


if __name__ == "__main__":
    main()

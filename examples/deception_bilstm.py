"""Pruthi et al.'s deceptive attention with the BiLSTM on the bundled sst_wiki and pronoun tasks.

    OMP_NUM_THREADS=1 python examples/deception_bilstm.py --tasks pronoun --lams 0 0.1 1

For each task, BiLSTM models (Pruthi's scorer: Linear(2H, 1)) are trained with the same seed: without penalty
(λ = 0) and with ``DeceptionPenalty(weight=λ)`` added to the cross-entropy through
``AttentionClassifier(objectives=[...])``. Two callbacks audit them:

* ``ImpermissibleAttentionMonitor`` follows the attention mass on the impermissible tokens on the whole dev split
  after every epoch (and on the whole test split in ``trainer.test``);
* ``AttentionAudit`` (gradient, leave-one-out) runs in ``trainer.test`` on a fixed subset of the test split and
  logs ``impermissible_share/<map>``: the share of each map's |score| that falls on the impermissible tokens.
  If gradient/LOO still point there while attention does not, saliency is not fooled: the model still *uses*
  the tokens its attention hides.

``--lam-delay-steps D --lam-warmup-steps N`` trains the first D optimizer steps without the penalty, then ramps λ
linearly to its full value over N steps (Pruthi et al. use the full λ from the first step; the penalty's formula is
unchanged either way; the warm-up is a recipe option for short CPU budgets, see RESULTS_losses.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Subset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import losses_common as C  # noqa: E402

from lightning_xai.callbacks import AttentionAudit, ImpermissibleAttentionMonitor  # noqa: E402
from lightning_xai.data import collate  # noqa: E402
from lightning_xai.losses import DeceptionPenalty  # noqa: E402
from lightning_xai.models import AttentionClassifier  # noqa: E402

SALIENCY = ("gradient", "leave_one_out")


class LambdaWarmup(pl.Callback):
    """Warm-up of a penalty's ``lam`` before every optimizer step: 0 for the first ``delay`` steps, then a linear
    ramp λ·(k + 1)/``steps`` over the next ``steps`` steps (k counted from the end of the delay), then λ."""

    def __init__(self, penalty: DeceptionPenalty, delay: int = 0, steps: int = 0) -> None:
        self.penalty = penalty
        self.delay = delay
        self.steps = steps
        self.target = penalty.weight

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        k = trainer.global_step - self.delay
        factor = 0.0 if k < 0 else min(1.0, (k + 1) / self.steps) if self.steps else 1.0
        self.penalty.weight = self.target * factor


def train_loader(dm, limit: Optional[int], batch_size: int, seed: int = 0) -> DataLoader:
    """Shuffled training batches; ``limit`` takes a random subset (the bundled files are grouped by label)."""
    dataset = dm.dataset("train")
    if limit is not None and limit < len(dataset):
        chosen = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:limit]
        dataset = Subset(dataset, sorted(chosen.tolist()))
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=True, collate_fn=collate, generator=torch.Generator().manual_seed(seed)
    )


def uniform_share(batches) -> float:
    """Mean share of real tokens that are impermissible: the mass a uniform attention puts there."""
    shares = [b["impermissible"].sum(-1) / b["mask"].sum(-1) for b in batches]
    return torch.cat(shares).float().mean().item()


def run_one(task: str, dm, lam: float, args, train, val, test) -> Dict[str, Any]:
    penalty = DeceptionPenalty(weight=lam) if lam > 0 else None
    options = dict(C.MODEL_KWARGS, hidden_dim=args.hidden_dim, lr=args.lr)
    if args.embedding_init == "minilm":
        options.update(embedding_init="minilm", embedding_rms=0.2, embedding_oov="zero")
    pl.seed_everything(args.seed, verbose=False)  # the same initial weights for every λ (C.fit seeds training)
    model = AttentionClassifier(
        dm.vocab_size,
        dm.num_classes,
        vocab=dm.vocab.itos,
        attention="linear",
        objectives=[penalty] if penalty is not None else [],
        **options,
    )
    monitor = ImpermissibleAttentionMonitor(num_samples=None, every_n_epochs=1)
    audit = AttentionAudit(
        methods=SALIENCY,
        metrics=("kendall_tau",),
        every_n_epochs=0,
        on_validate=False,
        on_test=True,
        num_samples=args.audit_samples,
    )
    callbacks: List[pl.Callback] = [monitor, audit]
    if penalty is not None and (args.lam_delay_steps or args.lam_warmup_steps):
        callbacks.append(LambdaWarmup(penalty, args.lam_delay_steps, args.lam_warmup_steps))
    info = C.fit(model, train, val, args.epochs, seed=args.seed, callbacks=callbacks, select_best=args.select == "best")
    trainer: pl.Trainer = info["trainer"]
    trainer.test(model, dataloaders=test, verbose=False)
    curve = [r["metrics"]["mass/mean"] for r in monitor.history if r["stage"] == "fit"]
    accs = [r["metrics"]["accuracy"] for r in monitor.history if r["stage"] == "fit"]
    tested = [r["metrics"] for r in monitor.history if r["stage"] == "test"][-1]
    shares = [r["metrics"] for r in audit.history if r["stage"] == "test"][-1]
    row = {
        "task": task,
        "lam": lam,
        "acc": tested["accuracy"],
        "mass": tested["mass/mean"],
        "below": tested["mass/below_0.01"],
        "curve": curve,
        "val_acc": accs,
        "best_epoch": 1 + max(range(len(accs)), key=lambda i: accs[i]) if args.select == "best" else len(accs),
        "seconds": info["seconds"],
    }
    for name in ("attention", *SALIENCY):
        row[name] = shares[f"impermissible_share/{name}/mean"]
    row["tau"] = shares["kendall_tau/attention_vs_gradient/mean"]
    print(f"{task} λ={lam}: {row}", flush=True)
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["sst_wiki", "pronoun"])
    parser.add_argument("--lams", type=float, nargs="+", default=[0.0, 0.1, 1.0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-limit", type=int, default=None, help="random subset of the training split")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden-dim", type=int, default=64)
    parser.add_argument("--embedding-init", choices=["normal", "minilm"], default="normal")
    parser.add_argument("--lam-delay-steps", type=int, default=0, help="λ = 0 for the first N optimizer steps")
    parser.add_argument("--lam-warmup-steps", type=int, default=0, help="then a linear λ ramp over N steps")
    parser.add_argument("--audit-samples", type=int, default=512, help="test examples the AttentionAudit reads")
    parser.add_argument("--seed", type=int, default=0, help="initial weights, batch order, training subset")
    parser.add_argument(
        "--select", choices=["best", "last"], default="best", help="keep the best-dev-accuracy epoch or the last one"
    )
    parser.add_argument("--section", default="deception_run", help="writes examples/results/<section>.md")
    args = parser.parse_args(argv)
    C.setup_threads()
    rows = []
    for task in args.tasks:
        dm = C.datamodule(task)
        train = train_loader(dm, args.train_limit, args.batch_size, seed=args.seed)
        val, test = C.loader(dm, "val"), C.loader(dm, "test")
        uniform = uniform_share(test)
        for lam in args.lams:
            r = run_one(task, dm, lam, args, train, val, test)
            rows.append(
                [
                    task,
                    f"{lam:g}",
                    r["acc"],
                    100 * r["mass"],
                    100 * uniform,
                    100 * r["attention"],
                    100 * r["gradient"],
                    100 * r["leave_one_out"],
                    r["tau"],
                    " → ".join(f"{100 * m:.2f}" for m in r["curve"]),
                    " → ".join(f"{a:.3f}" for a in r["val_acc"]),
                    r["best_epoch"],
                ]
            )
    recipe = (
        f"BiLSTM ({args.hidden_dim}/direction, embeddings {args.embedding_init}) + Linear(2H, 1) attention, "
        f"{args.epochs} epochs, batch {args.batch_size}, Adam lr {args.lr:g}"
        + (f", penalty off for the first {args.lam_delay_steps} steps" if args.lam_delay_steps else "")
        + (f", λ ramped linearly over the next {args.lam_warmup_steps} steps" if args.lam_warmup_steps else "")
        + (f", random {args.train_limit} training examples" if args.train_limit else ", full training split")
        + (", epoch of best dev accuracy kept" if args.select == "best" else ", last epoch kept")
        + f", seed {args.seed}."
    )
    text = [
        "### Deceptive attention (Pruthi et al.) with the BiLSTM",
        "",
        recipe,
        "",
        C.markdown_table(
            [
                "task",
                "λ",
                "test acc",
                "test attention mass %",
                "uniform %",
                "audit: attention share %",
                "audit: gradient share %",
                "audit: LOO share %",
                "audit: τ(attention, gradient)",
                "monitor: dev mass % by epoch",
                "dev acc by epoch",
                "kept epoch",
            ],
            rows,
        ),
        "",
        "Command: `OMP_NUM_THREADS=1 python examples/deception_bilstm.py " + " ".join(argv or sys.argv[1:]) + "`",
    ]
    # Only this run's section file: examples/results/deception_bilstm.md (merged by hand from the runs) is what
    # RESULTS_losses.md shows, so a partial run never overwrites the merged table.
    out = Path(__file__).resolve().parent / "results" / f"{args.section}.md"
    out.write_text("\n".join(text).strip() + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()

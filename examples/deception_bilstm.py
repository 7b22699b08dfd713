"""Pruthi et al.'s deceptive attention with the BiLSTM on the bundled sst_wiki and pronoun tasks.

    OMP_NUM_THREADS=1 python examples/deception_bilstm.py           # ~15 min on one CPU core

For each task, three BiLSTM models (Pruthi's scorer: Linear(2H, 1)) are trained with the same seed: without
penalty, and with DeceptionPenalty λ = 0.1 and λ = 1 added to the cross-entropy through
``AttentionClassifier(objectives=[...])``. An ImpermissibleAttentionMonitor follows the validation attention
mass on the impermissible tokens every epoch. On the test split we report accuracy, the attention mass on the
impermissible tokens, and the share of gradient (L2 over the embedding) and leave-one-out saliency that falls
on those tokens: if saliency still points there, the model still *uses* the tokens its attention hides.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import losses_common as C  # noqa: E402

from lightning_xai.attribution import attribute  # noqa: E402
from lightning_xai.callbacks import ImpermissibleAttentionMonitor  # noqa: E402
from lightning_xai.losses import DeceptionPenalty  # noqa: E402
from lightning_xai.models import AttentionClassifier  # noqa: E402


def shares(model, batches, saliency_limit: int) -> Dict[str, float]:
    """Test accuracy, impermissible attention mass, impermissible share of gradient / LOO saliency."""
    model.eval()
    correct = n = 0
    mass: List[torch.Tensor] = []
    token_share: List[torch.Tensor] = []
    grad_share: List[torch.Tensor] = []
    loo_share: List[torch.Tensor] = []
    seen = 0
    for batch in batches:
        with torch.no_grad():
            out = model(batch)
        imp = batch["impermissible"].float()
        correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
        n += len(batch["labels"])
        mass.append((out.attention * imp).sum(-1))
        token_share.append(imp.sum(-1) / batch["mask"].sum(-1))
        if seen < saliency_limit:
            for name, store in (("gradient", grad_share), ("leave_one_out", loo_share)):
                s = attribute(model, batch, name).abs()
                store.append((s * imp).sum(-1) / s.sum(-1).clamp_min(1e-12))
            seen += len(batch["labels"])
    cat = lambda xs: torch.cat(xs).mean().item()  # noqa: E731
    return {"acc": correct / n, "mass": cat(mass), "token_share": cat(token_share), "grad_share": cat(grad_share),
            "loo_share": cat(loo_share), "saliency_n": seen}


def run_task(task: str, lams, epochs: int, train_limit, saliency_limit: int, select: str = "best") -> List[list]:
    dm = C.datamodule(task)
    train = C.loader(dm, "train", train_limit, shuffle=True)
    val = C.loader(dm, "val")
    test = list(C.loader(dm, "test"))
    rows = []
    for lam in lams:
        objectives = [DeceptionPenalty(lam=lam)] if lam > 0 else []
        model = AttentionClassifier(dm.vocab_size, dm.num_classes, vocab=dm.vocab.itos, attention="linear",
                                    objectives=objectives, **C.MODEL_KWARGS)
        monitor = ImpermissibleAttentionMonitor(num_samples=256, every_n_epochs=1)
        info = C.fit(model, train, val, epochs, seed=0, callbacks=[monitor], select_best=select == "best")
        curve = [r["metrics"].get("mass/mean", float("nan")) for r in monitor.history if r["stage"] == "fit"]
        r = shares(model, test, saliency_limit)
        print(f"{task} λ={lam}: {r} val-mass per epoch {curve} ({info['seconds']:.0f}s)")
        rows.append([task, f"{lam:g}", r["acc"], 100 * r["mass"], 100 * r["token_share"], 100 * r["grad_share"],
                     100 * r["loo_share"], " → ".join(f"{100 * m:.1f}" for m in curve)])
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["sst_wiki", "pronoun"])
    parser.add_argument("--lams", type=float, nargs="+", default=[0.0, 0.1, 1.0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-limit", type=int, default=None)
    parser.add_argument("--saliency-limit", type=int, default=512, help="test examples for gradient/LOO shares")
    parser.add_argument("--select", choices=["best", "last"], default="best",
                        help="keep the best-dev-accuracy epoch or the last one")
    parser.add_argument("--section", default="deception_bilstm", help="name of the results section written")
    args = parser.parse_args(argv)
    C.setup_threads()
    rows = []
    for task in args.tasks:
        rows += run_task(task, args.lams, args.epochs, args.train_limit, args.saliency_limit, args.select)
    text = ["### Deceptive attention (Pruthi et al.) with the BiLSTM", "",
            f"BiLSTM (64/direction) + Linear(2H, 1) attention, {args.epochs} epochs"
            + (f" on the first {args.train_limit} training examples" if args.train_limit else "")
            + (", best dev accuracy epoch" if args.select == "best" else ", last epoch") + ", seed 0; λ = 0 is the unpenalised model. Test split: accuracy and attention mass "
              "on impermissible tokens (%); share (%) of |gradient| (L2 over the embedding) and |leave-one-out| "
              f"saliency on those tokens over the first {args.saliency_limit} test examples; the last column is the "
              "ImpermissibleAttentionMonitor's mean validation mass (%) after each epoch.", "",
            C.markdown_table(["task", "λ", "test acc", "attention mass %", "impermissible tokens %",
                              "gradient share %", "LOO share %", "val mass % by epoch"], rows), "",
            "Command: `OMP_NUM_THREADS=1 python examples/deception_bilstm.py " + " ".join(argv or sys.argv[1:]) + "`"]
    C.write_section(args.section, "\n".join(text))


if __name__ == "__main__":
    main()

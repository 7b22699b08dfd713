"""Supervised attention on ERASER Movie Reviews: does training attention toward human rationales make it more
plausible, more faithful, or only more plausible?

    python examples/rationale_supervision_eraser.py                  # weights 0 (no loss) and 1
    python examples/rationale_supervision_eraser.py --weights 0 0.3 1 --json results.json

Trains the reference BiLSTM + tanh attention (32-d embeddings, 16 units per direction) on the 1,600 training
reviews **truncated to their first ``--max-length`` tokens**, once per weight of
:class:`~lightning_xai.losses.RationaleSupervisionLoss` (KL(rationale ‖ attention), training rationales only),
selects the epoch by dev accuracy, and reports on the 199 test reviews: accuracy; attention plausibility against
the held-out test rationales (token F1 of the top-|rationale| tokens, AUPRC); attention faithfulness (ERASER AOPC
comprehensiveness and sufficiency of the attention ranking, and per-review Kendall τ-b between attention and
signed leave-one-out).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from typing import Dict

import numpy as np
import pytorch_lightning as pl
import torch
from debate_common import parse_args, report
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_xai.attribution import attribute
from lightning_xai.data import TextClassificationDataModule
from lightning_xai.losses import RationaleSupervisionLoss
from lightning_xai.metrics.functional import aopc, auprc, kendall_tau, token_f1
from lightning_xai.models import AttentionClassifier


def train(
    args: argparse.Namespace, dm: TextClassificationDataModule, weight: float, workdir: str
) -> AttentionClassifier:
    pl.seed_everything(args.seed, verbose=False)
    objectives = [RationaleSupervisionLoss(weight=weight)] if weight > 0 else []
    model = AttentionClassifier(
        dm.vocab_size,
        2,
        embedding_dim=32,
        hidden_dim=16,
        embedding_std=0.2,
        lr=3e-3,
        vocab=dm.vocab.itos,
        objectives=objectives,
    )
    best = ModelCheckpoint(dirpath=workdir, monitor="val/acc", mode="max", save_top_k=1)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=False,
        callbacks=[best],
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=workdir,
        deterministic=True,
    )
    trainer.fit(model, datamodule=dm)
    return AttentionClassifier.load_from_checkpoint(best.best_model_path).eval()  # the loss has no weights


def evaluate(model: AttentionClassifier, dm: TextClassificationDataModule) -> Dict[str, float]:
    loader = torch.utils.data.DataLoader(dm.dataset("test"), batch_size=32, collate_fn=dm.test_dataloader().collate_fn)
    values: Dict[str, list] = {k: [] for k in ("f1", "auprc", "comp", "suff", "tau", "correct", "mass")}
    for batch in loader:
        mask, rationale = batch["mask"], batch["rationale"]
        with torch.no_grad():
            out = model(batch)
        prediction = out.logits.argmax(-1)
        attention = out.attention
        values["correct"] += (prediction == batch["labels"]).tolist()
        values["mass"] += (attention * rationale).sum(1).tolist()
        _, _, f1 = token_f1(attention, rationale, mask)
        values["f1"] += f1.tolist()
        values["auprc"] += auprc(attention, rationale, mask).tolist()
        comp, suff = aopc(model, batch, attention, target=prediction)
        values["comp"] += comp.tolist()
        values["suff"] += suff.tolist()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loo = attribute(model, batch, "leave_one_out", target=prediction, signed=True)
        tau, _ = kendall_tau(attention, loo, mask)
        values["tau"] += tau.tolist()
    return {k: float(np.nanmean(np.array(v, dtype=float))) for k, v in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", nargs="+", type=float, default=[0.0, 1.0])
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=6)
    args = parse_args(__doc__, parser)
    started = time.perf_counter()
    dm = TextClassificationDataModule(
        "eraser_movies", batch_size=64, max_length=args.max_length, min_freq=2, seed=args.seed
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("fit")
        dm.setup("test")
    rows = []
    for weight in args.weights:
        with tempfile.TemporaryDirectory() as workdir:
            model = train(args, dm, weight, workdir)
        row = {"weight": weight, **evaluate(model, dm), "seconds": time.perf_counter() - started}
        print(row, flush=True)
        rows.append(row)
    header = [
        "rationale loss weight",
        "test acc",
        "attention token F1 ↑",
        "AUPRC ↑",
        "mass on rationale",
        "comprehensiveness ↑",
        "sufficiency ↓",
        "τ(attention, LOO)",
    ]
    keys = ("correct", "f1", "auprc", "mass", "comp", "suff", "tau")
    report(args, rows, header, lambda r: [f"{r['weight']:g}"] + [f"{r[k]:.3f}" for k in keys], started)


if __name__ == "__main__":
    main()

"""Tutek & Šnajder's word tying on SST-2: does tying hidden states to their words raise attention↔LOO agreement?

    python examples/tying_sst2.py                      # weight 0 (no loss) and 1, both tying forms

Trains the small reference BiLSTM (32-d embeddings, 16 units per direction, tanh attention) for ``--epochs`` on
SST-2 with and without :class:`~lightning_xai.losses.WordTyingLoss`, then reports test accuracy and the
per-sentence Kendall τ-b between attention and leave-one-out (|Δp|) on the 1,821 test sentences (mean ± std).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pytorch_lightning as pl
import torch
from debate_common import parse_args, report

from lightning_xai.attribution import attribute
from lightning_xai.data import TextClassificationDataModule
from lightning_xai.losses import WordTyingLoss
from lightning_xai.metrics.functional import kendall_tau
from lightning_xai.models import AttentionClassifier


def run(dm: TextClassificationDataModule, mode: str, weight: float, epochs: int, seed: int) -> dict:
    pl.seed_everything(seed, verbose=False)
    objectives = [WordTyingLoss(hidden_dim=32, embedding_dim=32, weight=weight, mode=mode)] if weight > 0 else []
    model = AttentionClassifier(
        dm.vocab_size, 2, embedding_dim=32, hidden_dim=16, embedding_std=0.3, objectives=objectives
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    model.eval()
    taus, correct = [], []
    for batch in dm.test_dataloader():
        with torch.no_grad():
            out = model(batch)
        correct += (out.logits.argmax(-1) == batch["labels"]).tolist()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loo = attribute(model, batch, "leave_one_out")
        tau, _ = kendall_tau(out.attention, loo, batch["mask"])
        taus += tau.tolist()
    taus = np.array(taus, dtype=float)
    return {
        "mode": mode if weight > 0 else "none",
        "weight": weight,
        "test_acc": float(np.mean(correct)),
        "tau_mean": float(np.nanmean(taus)),
        "tau_std": float(np.nanstd(taus)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weight", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=2)
    args = parse_args(__doc__, parser)
    start = time.perf_counter()
    dm = TextClassificationDataModule("sst2", batch_size=32, seed=args.seed)
    dm.setup("fit")
    rows = [run(dm, "embedding", 0.0, args.epochs, args.seed)]
    rows += [run(dm, mode, args.weight, args.epochs, args.seed) for mode in ("embedding", "word")]
    report(
        args,
        rows,
        ["tying", "weight", "test acc", "τ(attention, LOO) mean ± std"],
        lambda r: [r["mode"], f"{r['weight']:g}", f"{r['test_acc']:.3f}", f"{r['tau_mean']:.3f} ± {r['tau_std']:.3f}"],
        start,
    )


if __name__ == "__main__":
    main()

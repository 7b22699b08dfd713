"""Masked fine-tuning on SST-2 (Madsen et al. 2024): do erasure metrics change once erased inputs are in distribution?

    python examples/masked_finetuning_sst2.py          # random_masking 0 and 0.5

Trains the small reference BiLSTM (32-d embeddings, 16 units per direction, tanh attention) for ``--epochs`` on
SST-2, once on the plain data and once with ``MaskedDataModule(dm, {}, random_masking=p)`` (each training sentence
masked with probability p, a Uniform(0, 1) share of its tokens set to ``<unk>``), then reports test accuracy and,
for the attention, leave-one-out and random rankings, ERASER AOPC comprehensiveness and sufficiency on the 1,821
test sentences with the erased tokens **replaced by ``<unk>``** (the masking seen in training) — the
in-distribution reading of erasure.
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
from lightning_xai.data import MaskedDataModule, TextClassificationDataModule
from lightning_xai.metrics.functional import AOPC_BINS
from lightning_xai.models import AttentionClassifier

RANKINGS = ("attention", "leave_one_out", "random")


def _unk_aopc(model: AttentionClassifier, batch: dict, scores: torch.Tensor, target: torch.Tensor) -> tuple:
    """AOPC comprehensiveness/sufficiency with the top-k% real tokens (ties: earlier first) replaced by <unk> (id 1)."""
    mask = batch["mask"]
    n = mask.sum(1)
    order = torch.argsort(scores.masked_fill(~mask, float("-inf")), dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(mask.shape[1]).expand_as(order))
    with torch.no_grad():
        full = model(batch).logits.softmax(-1).gather(1, target[:, None])[:, 0]
        comp, suff = torch.zeros_like(full), torch.zeros_like(full)
        for share in AOPC_BINS:
            k = torch.clamp(torch.ceil(share * n), min=1).long().unsqueeze(1)
            top = (rank < k) & mask
            for values, where in ((comp, top), (suff, mask & ~top)):
                ids = batch["input_ids"].masked_fill(where, 1)
                p = model({**batch, "input_ids": ids}).logits.softmax(-1).gather(1, target[:, None])[:, 0]
                values += full - p
    return comp / len(AOPC_BINS), suff / len(AOPC_BINS)


def run(dm: TextClassificationDataModule, probability: float, epochs: int, seed: int) -> dict:
    pl.seed_everything(seed, verbose=False)
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=32, hidden_dim=16, embedding_std=0.3)
    data = MaskedDataModule(dm, {}, random_masking=probability) if probability > 0 else dm
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=data)
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    correct, values = [], {r: {"comp": [], "suff": []} for r in RANKINGS}
    for batch in dm.test_dataloader():
        with torch.no_grad():
            out = model(batch)
        target = out.logits.argmax(-1)
        correct += (target == batch["labels"]).tolist()
        for name in RANKINGS:
            if name == "random":
                scores = torch.rand(batch["mask"].shape, generator=generator)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    scores = attribute(model, batch, name, target=target)
            comp, suff = _unk_aopc(model, batch, scores, target)
            values[name]["comp"] += comp.tolist()
            values[name]["suff"] += suff.tolist()
    row = {"random_masking": probability, "test_acc": float(np.mean(correct))}
    for name in RANKINGS:
        row[f"{name}_comp"] = float(np.mean(values[name]["comp"]))
        row[f"{name}_suff"] = float(np.mean(values[name]["suff"]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--probabilities", nargs="+", type=float, default=[0.0, 0.5])
    parser.add_argument("--epochs", type=int, default=2)
    args = parse_args(__doc__, parser)
    start = time.perf_counter()
    dm = TextClassificationDataModule("sst2", batch_size=32, seed=args.seed)
    dm.setup("fit")
    rows = [run(dm, p, args.epochs, args.seed) for p in args.probabilities]
    header = ["random_masking", "test acc"] + [f"{r} {m}" for r in RANKINGS for m in ("comp. ↑", "suff. ↓")]
    report(
        args,
        rows,
        header,
        lambda r: (
            [f"{r['random_masking']:g}", f"{r['test_acc']:.3f}"]
            + [f"{r[f'{n}_{m}']:.3f}" for n in RANKINGS for m in ("comp", "suff")]
        ),
        start,
    )


if __name__ == "__main__":
    main()

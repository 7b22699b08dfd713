"""Run by tests/metrics/test_ddp.py in a fresh interpreter: a 2-process DDP validation (CPU, gloo) that updates
lightning_xai metrics in validation_step and writes the synced values (rank 0) to a JSON file.

It is a script, not a test module, because Lightning's DDP launcher re-runs ``sys.argv`` in its child process:
re-running this small script is cheap, re-running a pytest session would not be.
"""

from __future__ import annotations

import json
import sys
from typing import Dict, List

import pytorch_lightning as pl
import torch

from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.metrics import (
    AOPC,
    AUPRC,
    IOUF1,
    Comprehensiveness,
    DecisionFlip,
    JensenShannon,
    KendallTau,
    PearsonCorrelation,
    SpearmanCorrelation,
    TokenF1,
    TopKKendallTau,
    TopKOverlap,
)
from lightning_xai.models import AttentionClassifier

N_EXAMPLES = 32  # divisible by 2 processes x batch 4: DistributedSampler adds no duplicates


def build_examples() -> List[dict]:
    """32 real SST-2 dev sentences, each with two fixed pseudo-random score maps and a pseudo rationale."""
    dm = TextClassificationDataModule("sst2", batch_size=4, seed=0)
    dm.setup("fit")
    dataset = dm.dataset("val")
    g = torch.Generator().manual_seed(123)
    items = []
    for i in range(N_EXAMPLES):
        item = dict(dataset[i])
        n = len(item["input_ids"])
        item["preds"] = torch.randn(n, generator=g).round(decimals=1).tolist()  # ties included
        item["target_map"] = torch.randn(n, generator=g).tolist()
        item["rationale"] = (torch.rand(n, generator=g) < 0.3).tolist()
        items.append(item)
    return items


def collate_examples(items: List[dict]) -> dict:
    batch = collate([{k: v for k, v in it.items() if k not in ("preds", "target_map")} for it in items])
    T = batch["input_ids"].shape[1]
    for key in ("preds", "target_map"):
        out = torch.zeros(len(items), T)
        for row, it in enumerate(items):
            out[row, : len(it[key])] = torch.tensor(it[key])
        batch[key] = out
    return batch


def build_model(vocab_size: int) -> AttentionClassifier:
    torch.manual_seed(0)
    return AttentionClassifier(vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=1.0).eval()


def make_metrics() -> Dict[str, torch.nn.Module]:
    return {
        "kendall": KendallTau(),
        "topk_kendall": TopKKendallTau(k=3),
        "spearman": SpearmanCorrelation(),
        "pearson": PearsonCorrelation(),
        "jsd": JensenShannon(),
        "overlap": TopKOverlap(k=0.3),
        "token_f1": TokenF1(k=0.3),
        "iou_f1": IOUF1(k=0.3),
        "auprc": AUPRC(),
        "comprehensiveness": Comprehensiveness(k=0.2),
        "aopc": AOPC(),
        "flip": DecisionFlip("gradient"),
    }


def update_all(metrics: Dict[str, torch.nn.Module], model: AttentionClassifier, batch: dict) -> None:
    mask = batch["mask"]
    for name in ("kendall", "topk_kendall", "spearman", "pearson", "jsd", "overlap"):
        metrics[name].update(batch["preds"], batch["target_map"], mask)
    for name in ("token_f1", "iou_f1", "auprc"):
        metrics[name].update(batch["target_map"], batch["rationale"], mask)
    metrics["comprehensiveness"].update(model, batch, batch["target_map"])
    metrics["aopc"].update(model, batch, batch["target_map"])
    metrics["flip"].update(model, batch)


def as_floats(metrics: Dict[str, torch.nn.Module]) -> Dict[str, Dict[str, float]]:
    return {name: {k: float(v) for k, v in metric.compute().items()} for name, metric in metrics.items()}


class MetricsModule(pl.LightningModule):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.net = build_model(vocab_size)
        self.audit = torch.nn.ModuleDict(make_metrics())
        self.result: Dict[str, Dict[str, float]] = {}

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        update_all(dict(self.audit.items()), self.net, batch)

    def on_validation_epoch_end(self) -> None:
        self.result = as_floats(dict(self.audit.items()))  # compute() syncs the sum states across processes
        self.seen = {"rank": self.global_rank, "world_size": self.trainer.world_size}


def main(out_path: str, root: str) -> None:
    items = build_examples()
    vocab_size = TextClassificationDataModule("sst2", batch_size=4, seed=0)
    vocab_size.setup("fit")
    module = MetricsModule(vocab_size.vocab_size)
    loader = torch.utils.data.DataLoader(items, batch_size=4, shuffle=False, collate_fn=collate_examples)
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=root,
    )
    trainer.validate(module, loader, verbose=False)
    if trainer.global_rank == 0:
        with open(out_path, "w") as handle:
            json.dump(
                {
                    "metrics": module.result,
                    "world_size": trainer.world_size,
                    "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                },
                handle,
            )
    # tear the gloo group down before exit: left to interpreter shutdown, its threads can abort the process
    # ("terminate called without an active exception", seen once in ~10 runs)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])

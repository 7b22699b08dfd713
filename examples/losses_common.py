"""Shared plumbing of the loss/audit examples (deception, adversary, diagnostic MLP, conicity/erasure).

Every example trains small reference models on the bundled real data on CPU with a real Lightning Trainer.
Trained base models are cached under ``runs/losses_examples/`` (git-ignored) so examples that share a base
(SST-2 BiLSTM) train it once.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Subset

from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.models import AttentionClassifier

RUNS = Path(os.environ.get("LXAI_RUNS", Path(__file__).resolve().parent.parent / "runs" / "losses_examples"))

# The small BiLSTM + tanh attention used throughout (J&W's shape, narrower for CPU).
MODEL_KWARGS: Dict[str, Any] = dict(embedding_dim=100, hidden_dim=64, embedding_std=0.3)


def setup_threads() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def datamodule(name: str, batch_size: int = 32, seed: int = 0) -> TextClassificationDataModule:
    dm = TextClassificationDataModule(name, batch_size=batch_size, seed=seed)
    dm.setup("fit")
    dm.setup("test")
    return dm


def loader(
    dm: TextClassificationDataModule,
    split: str,
    limit: Optional[int] = None,
    shuffle: bool = False,
    seed: int = 0,
    batch_size: Optional[int] = None,
) -> DataLoader:
    dataset = dm.dataset(split)
    if limit is not None and limit < len(dataset):
        dataset = Subset(dataset, range(limit))
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(
        dataset,
        batch_size=batch_size or dm.hparams.batch_size,
        shuffle=shuffle,
        collate_fn=collate,
        generator=generator,
    )


class _Best(pl.Callback):
    """Keep the weights of the epoch with the best ``val/acc`` in memory (no checkpoint files)."""

    def __init__(self) -> None:
        self.best = -1.0
        self.state: Optional[Dict[str, torch.Tensor]] = None
        self.history: List[Dict[str, float]] = []

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        self.history.append(metrics)
        acc = metrics.get("val/acc", 0.0)
        if acc > self.best:
            self.best = acc
            self.state = copy.deepcopy(pl_module.state_dict())


def fit(
    model: pl.LightningModule,
    train: DataLoader,
    val: DataLoader,
    epochs: int,
    seed: int = 0,
    callbacks: Sequence[pl.Callback] = (),
    select_best: bool = True,
    trainer_kwargs: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Fit with a real Trainer on CPU; restore the best-val-accuracy epoch. Returns timing and history."""
    pl.seed_everything(seed, verbose=False)
    best = _Best()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[best, *callbacks],
        default_root_dir=str(RUNS / "trainer"),
        **(trainer_kwargs or {}),
    )
    start = time.time()
    trainer.fit(model, train, val)
    if select_best and best.state is not None:
        model.load_state_dict(best.state)
    return {"seconds": time.time() - start, "history": best.history, "best_val_acc": best.best, "trainer": trainer}


@torch.no_grad()
def predict(model: Any, batches: Iterable[Dict[str, torch.Tensor]], attention_override_fn=None) -> Dict[str, Any]:
    """Probabilities, attention, labels and masks of every batch (eval mode)."""
    model.eval()
    out: Dict[str, List[torch.Tensor]] = {"probs": [], "attention": [], "labels": [], "mask": []}
    for batch in batches:
        override = attention_override_fn(batch) if attention_override_fn is not None else None
        result = model(batch, attention_override=override) if override is not None else model(batch)
        out["probs"].append(result.logits.softmax(-1))
        out["attention"].append(result.attention)
        out["labels"].append(batch["labels"])
        out["mask"].append(batch["mask"])
    return out


def accuracy(model: Any, batches: Iterable[Dict[str, torch.Tensor]]) -> float:
    pred = predict(model, batches)
    correct = sum(int((p.argmax(-1) == y).sum()) for p, y in zip(pred["probs"], pred["labels"]))
    return correct / sum(len(y) for y in pred["labels"])


def cached_classifier(
    tag: str,
    dm: TextClassificationDataModule,
    epochs: int,
    seed: int = 0,
    train_limit: Optional[int] = None,
    **kwargs: Any,
) -> AttentionClassifier:
    """Train (or load from ``runs/losses_examples/<tag>.pt``) a reference classifier on ``dm``."""
    RUNS.mkdir(parents=True, exist_ok=True)
    path = RUNS / f"{tag}.pt"
    options = {**MODEL_KWARGS, **kwargs}
    model = AttentionClassifier(dm.vocab_size, dm.num_classes, vocab=dm.vocab.itos, **options)
    if path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu"))
        print(f"[{tag}] loaded cached weights from {path}")
        return model.eval()
    info = fit(model, loader(dm, "train", train_limit, shuffle=True, seed=seed), loader(dm, "val"), epochs, seed)
    torch.save(model.state_dict(), path)
    print(f"[{tag}] trained {epochs} epochs in {info['seconds']:.0f}s, best val acc {info['best_val_acc']:.3f}")
    return model.eval()


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, text: str) -> Path:
    """Write this example's README-ready section to ``examples/results/<name>.md`` (merged into RESULTS_losses.md)."""
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"{name}.md"
    previous = path.read_text().strip() if path.exists() else None
    path.write_text(text.strip() + "\n")
    print(text)
    target = out.parent / "RESULTS_losses.md"
    current = target.read_text() if target.exists() else ""
    if previous and previous in current:  # splice: leave every other section exactly as it is
        target.write_text(current.replace(previous, text.strip(), 1))
    elif not current:
        rebuild_results()
    else:
        print(
            f"NOTE: {target.name} not updated (its '{name}' section differs from {path}); merge by hand or run "
            "losses_common.rebuild_results()."
        )
    return path


ORDER = ("deception_bilstm", "adversary_sst2", "adversarial_search_sst2", "diagnostic_mlp", "conicity_erasure_sst2")
INTRO = """## Loss modules and audit experiments on the bundled real data

Measured on CPU (one thread) with the examples below; every figure comes from the command under its table.
Models are small (embedding 100, BiLSTM 64 units per direction, N(0, 0.3²) embedding initialisation, no
pretrained vectors), so absolute accuracies sit below the papers'. Regenerated by each example from
`examples/results/*.md`."""


def rebuild_results() -> Path:
    """Concatenate the sections in ``examples/results/`` into ``examples/RESULTS_losses.md``."""
    here = Path(__file__).resolve().parent
    parts = [INTRO]
    for name in ORDER:
        section = here / "results" / f"{name}.md"
        if section.exists():
            parts.append(section.read_text().strip())
    target = here / "RESULTS_losses.md"
    target.write_text("\n\n".join(parts) + "\n")
    return target


def sst2_base(dm: TextClassificationDataModule, seed: int = 0) -> AttentionClassifier:
    """The audited SST-2 model: BiLSTM + J&W tanh attention, 8 epochs, best dev accuracy (cached)."""
    tag = "sst2_base" if seed == 0 else f"sst2_base_seed{seed}"
    return cached_classifier(tag, dm, epochs=8, seed=seed, attention="tanh")

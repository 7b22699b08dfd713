"""A causal LM that generates SST-2's label word, audited during training, against the classification head.

Issue #31, experiment 3. The same bundled SST-2 data and word vocabulary as ``examples/llama_sst2.py``, two small
Llama-architecture models trained from scratch with the same size, seed, epochs and optimiser (hidden 64, 2 layers,
AdamW lr 2e-3, weight decay 0.01, 10% linear warm-up then linear decay, batch 32):

* **causal LM**: ``LlamaForCausalLM`` reads ``<sos> w1 … wn sentiment : <label word>`` ("negative"/"positive") and is
  trained on the LM loss of the label word alone (``labels`` -100 everywhere else, transformers' convention); its
  LightningModule (:class:`LabelWordLM`) is plain user code with nothing of lightning_xai in it. Accuracy: the label
  word with the higher log-probability at the target position.
* **classifier head**: ``LlamaForSequenceClassification`` on ``w1 … wn`` (``examples/llama_sst2.py``'s ``DecoderSST2``
  and ``tiny_llama``, trained by ``HFClassifier``).

Both are audited at the end of every epoch by ``AttentionAudit`` and ``ErasureAudit`` with their default methods,
metrics and rankings on the same ``num_samples`` dev sentences (the subset is drawn from the same seed over the same
dev split, so both audit the same sentences).

**What the maps cover.** The causal LM's explained quantity is log p(label word | prompt). The audits' maps cover the
prompt's *review words* only: the batch's ``mask`` marks ``w1 … wn``, so ``<sos>`` and the cue ``sentiment :`` are
not part of the source. The cue is the same in every prompt (it carries no information about the review), deleting
it in an erasure would make the prompt one the model never saw, and leaving it out gives both models maps over
exactly the same tokens, the review words the classifier's maps cover. The cue is still read by the model (the
label word's attention row is the one at ``:``); attention rows are renormalised over the review words.

All four prompt words ("sentiment", ":", "negative", "positive") are words of SST-2's training split, so the word
vocabulary is llama_sst2.py's, unchanged (``<sos>``, already in it, is the prompt's first token).

**Audit cadence.** ``budget=None`` is the one option passed besides ``num_samples``: by default a callback thins its
cadence to keep audits within 5% of the training time, and here ErasureAudit on 256 sentences took 30% of the causal
LM's training epoch (13% of the classifier's), so the default would skip the LM's epochs.

Usage::

    OMP_NUM_THREADS=1 python examples/causal_lm_sst2.py --epochs 3 --audit-samples 256 \\
        --output examples/results/causal_lm_sst2.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_sst2 import DecoderSST2, tiny_llama  # noqa: E402

from lightning_xai import TextClassificationDataModule  # noqa: E402
from lightning_xai.callbacks import AttentionAudit, ErasureAudit  # noqa: E402
from lightning_xai.data.datamodule import EncodedDataset  # noqa: E402
from lightning_xai.data.vocabulary import SOS  # noqa: E402
from lightning_xai.models import HFClassifier  # noqa: E402

#: the words between the review and its label word
CUE = ("sentiment", ":")
#: the label word of class 0 and class 1
LABEL_WORDS = ("negative", "positive")
IGNORE = -100
MODEL_NAMES = {"causal_lm": "LlamaForCausalLM", "classifier": "LlamaForSequenceClassification"}

#: the table's rows: (title, callback, key); the key's "/mean" is read from the callback's history
ROWS: Tuple[Tuple[str, str, str], ...] = (
    ("τ(attention, gradient)", "attention_audit", "kendall_tau/attention_vs_gradient"),
    ("τ(attention, \\|grad×input\\|)", "attention_audit", "kendall_tau/attention_vs_grad_x_input"),
    *(
        (f"{r}: {v}", "erasure_audit", f"{r}/{v}")
        for r in ("attention", "attention_gradient", "random")
        for v in ("fraction_removed", "flipped", "comprehensiveness", "sufficiency")
    ),
)


# --- data: the prompt layout ---------------------------------------------------------------------------------------
def prompt_item(item: Dict[str, Any], bos: int, cue: Sequence[int], label_ids: Sequence[int]) -> Dict[str, Any]:
    """An encoded SST-2 item as ``<sos> w1 … wn sentiment : <label word>``: ``labels`` -100 except at the label word,
    ``mask`` True at the review words only (the audits' source), ``attention_mask`` 1 everywhere."""
    words = list(item["input_ids"])
    label = label_ids[item["labels"]]
    ids = [bos, *words, *cue, label]
    return {
        "input_ids": ids,
        "mask": [False, *[True] * len(words), *[False] * (len(cue) + 1)],
        "labels": [IGNORE] * (len(ids) - 1) + [label],
        "index": item["index"],
    }


def prompt_collate(items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """Right-padded batch: ``input_ids`` (pad 0), ``attention_mask``, ``mask`` (bool), ``labels`` (pad -100),
    ``index``."""
    width = max(len(item["input_ids"]) for item in items)
    out = {
        "input_ids": torch.zeros(len(items), width, dtype=torch.long),
        "attention_mask": torch.zeros(len(items), width, dtype=torch.long),
        "mask": torch.zeros(len(items), width, dtype=torch.bool),
        "labels": torch.full((len(items), width), IGNORE, dtype=torch.long),
        "index": torch.tensor([item["index"] for item in items], dtype=torch.long),
    }
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        out["input_ids"][row, :n] = torch.tensor(item["input_ids"])
        out["attention_mask"][row, :n] = 1
        out["mask"][row, :n] = torch.tensor(item["mask"])
        out["labels"][row, :n] = torch.tensor(item["labels"])
    return out


class PromptDataset(Dataset):
    """An :class:`EncodedDataset` split as prompts (:func:`prompt_item`)."""

    def __init__(self, encoded: EncodedDataset, bos: int, cue: Sequence[int], label_ids: Sequence[int]) -> None:
        self.encoded, self.bos, self.cue, self.label_ids = encoded, bos, list(cue), list(label_ids)

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        return prompt_item(self.encoded[index], self.bos, self.cue, self.label_ids)


class FirstN:
    """Data-module mixin: only the first ``sizes[split]`` examples of a split (the vocabulary stays the full
    training split's)."""

    sizes: Dict[str, Optional[int]] = {}

    def dataset(self, split: str) -> Any:
        full = super().dataset(split)  # type: ignore[misc]
        n = self.sizes.get(split)
        return full if n is None else EncodedDataset(full.examples[:n], full.vocab, full.add_sos_eos)


class ReviewSST2(FirstN, DecoderSST2):
    """llama_sst2.py's ``DecoderSST2`` (the classifier's batches), optionally cut to the first examples of a split."""

    def __init__(self, sizes: Dict[str, Optional[int]], **kwargs: Any) -> None:
        super().__init__("sst2", **kwargs)
        self.sizes = dict(sizes)


class PromptSST2(FirstN, TextClassificationDataModule):
    """Bundled SST-2 as label-word prompts for a causal LM, with the classifier's word vocabulary."""

    def __init__(self, sizes: Dict[str, Optional[int]], **kwargs: Any) -> None:
        super().__init__("sst2", **kwargs)
        self.sizes = dict(sizes)

    def ids(self, words: Sequence[str]) -> List[int]:
        missing = [w for w in words if w not in self.vocab.stoi]
        if missing:
            raise ValueError(f"prompt words {missing} are not in the SST-2 training vocabulary.")
        return [self.vocab.stoi[w] for w in words]

    @property
    def bos(self) -> int:
        return self.vocab.stoi[SOS]

    @property
    def label_ids(self) -> List[int]:
        return self.ids(LABEL_WORDS)

    def dataset(self, split: str) -> Any:
        return PromptDataset(super().dataset(split), self.bos, self.ids(CUE), self.label_ids)

    def loader_settings(self):
        return super().loader_settings()._replace(collate_fn=prompt_collate)


# --- models --------------------------------------------------------------------------------------------------------
def tiny_causal_llama(vocab_size: int, hidden: int, layers: int, seed: int, bos: int, max_positions: int = 128):
    """``LlamaForCausalLM`` with llama_sst2.py's ``tiny_llama`` settings (4 heads, 2 key-value heads, MLP 2×hidden,
    eager attention, pad id 0), from ``torch.manual_seed(seed)``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=max_positions,
        pad_token_id=0,
        bos_token_id=bos,
        eos_token_id=None,
        attn_implementation="eager",
    )
    return LlamaForCausalLM(config)


def adamw_with_schedule(
    module: pl.LightningModule, named: Any, lr: float, weight_decay: float, warmup_ratio: float = 0.1
) -> Dict[str, Any]:
    """HFClassifier's optimiser: AdamW (no decay on biases and LayerNorm), linear warm-up then linear decay."""
    skip = {id(p) for n, p in named if n.endswith("bias") or "LayerNorm" in n}
    decay = [p for p in module.parameters() if id(p) not in skip]
    no_decay = [p for p in module.parameters() if id(p) in skip]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    total = max(1, int(module.trainer.estimated_stepping_batches))
    warmup = int(warmup_ratio * total)

    def schedule(step: int) -> float:
        return (step + 1) / (warmup + 1) if step < warmup else max(0.0, (total - step) / max(1, total - warmup))

    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, schedule), "interval": "step"},
    }


def label_word_choice(
    logits: torch.Tensor, labels: torch.Tensor, label_ids: Sequence[int]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(predicted class, gold class) ``[B]``: the label word with the higher logit (hence log-probability) at the
    position that predicts each row's one target token, and the class of that target."""
    rows, where = (labels != IGNORE).nonzero(as_tuple=True)
    if rows.numel() != labels.shape[0] or not torch.equal(rows, torch.arange(labels.shape[0], device=rows.device)):
        raise ValueError("every row needs exactly one target token (its label word).")
    candidates = torch.tensor(list(label_ids), device=logits.device)
    predicted = logits[rows, where - 1][:, candidates].argmax(-1)
    gold = (labels[rows, where][:, None] == candidates).long().argmax(-1)
    return predicted, gold


class LabelWordLM(pl.LightningModule):
    """The user's own module: a causal LM trained on the LM loss of the label word (the batch's ``labels``)."""

    def __init__(
        self, model: torch.nn.Module, label_ids: Sequence[int], vocab: Sequence[str], lr: float, weight_decay: float
    ) -> None:
        super().__init__()
        self.model, self.label_ids, self.vocab = model, list(label_ids), list(vocab)
        self.lr, self.weight_decay = lr, weight_decay

    def _forward(self, batch: Dict[str, torch.Tensor]):
        return self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])

    def training_step(self, batch, batch_idx):
        loss = self._forward(batch).loss
        self.log("train/loss", loss, batch_size=len(batch["input_ids"]))
        return loss

    def validation_step(self, batch, batch_idx):
        out = self._forward(batch)
        predicted, gold = label_word_choice(out.logits, batch["labels"], self.label_ids)
        size = len(batch["input_ids"])
        self.log("val/loss", out.loss, batch_size=size)
        self.log("val/acc", (predicted == gold).float().mean(), batch_size=size)

    def configure_optimizers(self):
        return adamw_with_schedule(self, self.model.named_parameters(), self.lr, self.weight_decay)


class EpochAccuracy(pl.Callback):
    """Keeps ``val/acc`` of every validation epoch of ``fit``."""

    def __init__(self) -> None:
        self.values: List[float] = []

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and "val/acc" in trainer.callback_metrics:
            self.values.append(float(trainer.callback_metrics["val/acc"]))


# --- the experiment ------------------------------------------------------------------------------------------------
def build(kind: str, settings: Dict[str, Any]) -> Tuple[pl.LightningModule, pl.LightningDataModule]:
    """(module, data module) of ``"causal_lm"`` or ``"classifier"`` with ``settings`` (see :func:`run`)."""
    sizes = {"train": settings["train_size"], "val": settings["val_size"]}
    common = dict(batch_size=settings["batch_size"], seed=settings["seed"])
    if kind == "causal_lm":
        dm: Any = PromptSST2(sizes, **common)
        dm.prepare_data()
        dm.setup("fit")
        model = tiny_causal_llama(dm.vocab_size, settings["hidden"], settings["layers"], settings["seed"], dm.bos)
        return LabelWordLM(model, dm.label_ids, dm.vocab.itos, settings["lr"], settings["weight_decay"]), dm
    dm = ReviewSST2(sizes, **common)
    dm.prepare_data()
    dm.setup("fit")
    model = tiny_llama(dm.vocab_size, settings["hidden"], settings["layers"], settings["seed"])
    return HFClassifier(model=model, lr=settings["lr"], weight_decay=settings["weight_decay"]), dm


def train_and_audit(kind: str, settings: Dict[str, Any], log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Train one model with both audits attached (every epoch); its per-epoch accuracy and audit metrics."""
    pl.seed_everything(settings["seed"], verbose=False)
    module, dm = build(kind, settings)
    audits = [
        AttentionAudit(num_samples=settings["audit_samples"], budget=None),
        ErasureAudit(num_samples=settings["audit_samples"], budget=None),
    ]
    accuracy = EpochAccuracy()
    trainer = pl.Trainer(
        max_epochs=settings["epochs"],
        callbacks=[*audits, accuracy],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=settings.get("root"),
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    seconds = time.perf_counter() - start
    out: Dict[str, Any] = {
        "model": MODEL_NAMES[kind],
        "train_examples": len(dm.dataset("train")),
        "val_examples": len(dm.dataset("val")),
        "val_acc": accuracy.values,
        "fit_seconds_with_audits": round(seconds, 1),
    }
    for audit in audits:
        out[audit.log_prefix] = [
            {
                "epoch": r["epoch"],
                "num_examples": r["num_examples"],
                "explained_quantity": r.get("explained_quantity"),
                "metrics": r["metrics"],
            }
            for r in audit.history
        ]
    log(f"{kind}: {seconds:.0f}s, val acc {[round(a, 4) for a in accuracy.values]}")
    return out


def run(
    *,
    epochs: int = 3,
    hidden: int = 64,
    layers: int = 2,
    lr: float = 2e-3,
    weight_decay: float = 0.01,
    batch_size: int = 32,
    audit_samples: int = 256,
    seed: int = 0,
    train_size: Optional[int] = None,
    val_size: Optional[int] = None,
    root: Optional[str] = None,
    log: Callable[[str], None] = print,
) -> Dict[str, Any]:
    """Both models trained and audited with the same settings: ``{"settings", "causal_lm", "classifier"}``."""
    settings = dict(
        epochs=epochs,
        hidden=hidden,
        layers=layers,
        lr=lr,
        weight_decay=weight_decay,
        batch_size=batch_size,
        audit_samples=audit_samples,
        seed=seed,
        train_size=train_size,
        val_size=val_size,
    )
    result: Dict[str, Any] = {
        "settings": dict(settings),
        "prompt": f"<sos> w1 … wn {' '.join(CUE)} <label word>",
        "label_words": list(LABEL_WORDS),
        "source": "the review words w1 … wn",
    }
    for kind in ("causal_lm", "classifier"):
        result[kind] = train_and_audit(kind, dict(settings, root=root), log)
    return result


def table(result: Dict[str, Any]) -> str:
    """A markdown table: per epoch, the dev accuracy and the audits' means, causal LM vs classifier head."""
    lm, head = result["causal_lm"], result["classifier"]
    epochs = range(len(lm["attention_audit"]))
    header = "| | " + " | ".join(f"LM ep {e + 1} | head ep {e + 1}" for e in epochs) + " |"
    lines = [header, "|---" * (1 + 2 * len(epochs)) + "|"]

    def cell(value: Optional[float]) -> str:
        return "n/a" if value is None or value != value else f"{value:.3f}"

    accs = [cell(m["val_acc"][e] if e < len(m["val_acc"]) else None) for e in epochs for m in (lm, head)]
    lines.append("| dev accuracy | " + " | ".join(accs) + " |")
    for title, prefix, key in ROWS:
        values = [cell(m[prefix][e]["metrics"].get(f"{key}/mean")) for e in epochs for m in (lm, head)]
        lines.append(f"| {title} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--audit-samples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=None, help="first N training sentences (default: all)")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    result = run(
        epochs=args.epochs,
        hidden=args.hidden,
        layers=args.layers,
        lr=args.lr,
        weight_decay=args.weight_decay,
        batch_size=args.batch_size,
        audit_samples=args.audit_samples,
        seed=args.seed,
        train_size=args.train_size,
    )
    result["command"] = "OMP_NUM_THREADS=1 python examples/causal_lm_sst2.py " + " ".join(sys.argv[1:])
    print(table(result))
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()

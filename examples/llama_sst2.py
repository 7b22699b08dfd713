"""A small Llama-architecture decoder classifier trained from scratch on the bundled SST-2, then audited.

No pretrained decoder ships offline, so this builds ``LlamaForSequenceClassification`` from a config (word-level
vocabulary of the bundled data, nothing downloaded), trains it with :class:`HFClassifier`, and runs
``AttentionAudit`` and ``ErasureAudit`` on the dev set. The adapter reads each sentence's last real token — the row
the decoder's head pools — with no hint (see README, "Transformer families").

Usage::

    OMP_NUM_THREADS=1 python examples/llama_sst2.py --epochs 3 --audit-samples 256 \\
        --output examples/results/llama_sst2.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, List

import pytorch_lightning as pl
import torch

from lightning_xai import TextClassificationDataModule
from lightning_xai.callbacks import AttentionAudit, ErasureAudit
from lightning_xai.data import collate
from lightning_xai.metrics.functional import AOPC_BINS
from lightning_xai.models import HFClassifier


def decoder_collate(items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """The bundled word-level batch plus the ``attention_mask`` a transformers model needs (pads are id 0)."""
    batch = collate(items)
    batch["attention_mask"] = batch["mask"].long()
    return batch


class DecoderSST2(TextClassificationDataModule):
    """Bundled SST-2, right-padded with id 0, with ``attention_mask`` in every batch."""

    def loader_settings(self):
        return super().loader_settings()._replace(collate_fn=decoder_collate)


def tiny_llama(vocab_size: int, hidden: int, layers: int, seed: int, max_positions: int = 128):
    from transformers import LlamaConfig, LlamaForSequenceClassification

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
        bos_token_id=None,
        eos_token_id=None,
        num_labels=2,
        attn_implementation="eager",
    )
    return LlamaForSequenceClassification(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--audit-samples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    pl.seed_everything(args.seed, verbose=False)
    dm = DecoderSST2("sst2", batch_size=args.batch_size, seed=args.seed)
    dm.prepare_data()
    dm.setup("fit")
    module = HFClassifier(
        model=tiny_llama(dm.vocab_size, args.hidden, args.layers, args.seed), lr=args.lr, weight_decay=0.01
    )
    trainer_options = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    start = time.process_time()
    pl.Trainer(max_epochs=args.epochs, **trainer_options).fit(module, datamodule=dm)
    train_cpu = time.process_time() - start
    common = dict(num_samples=args.audit_samples, every_n_epochs=0, on_validate=True, on_test=False, batch_size=32)
    audit = AttentionAudit(
        methods=["gradient", "grad_x_input", "leave_one_out", "integrated_gradients"],
        metrics=["kendall_tau", "jsd"],
        **common,
    )
    erasure = ErasureAudit(rankings=("attention", "attention_gradient", "random"), aopc_bins=AOPC_BINS, **common)
    metrics = pl.Trainer(callbacks=[audit, erasure], **trainer_options).validate(module, datamodule=dm, verbose=False)[
        0
    ]
    result = {
        "args": vars(args),
        "pooling": module.adapter.pooling,
        "train_cpu_s": round(train_cpu, 1),
        "val": {k: float(v) for k, v in metrics.items()},
        "attention_audit": audit.history[-1]["metrics"],
        "erasure_audit": erasure.history[-1]["metrics"],
    }
    text = json.dumps(result, indent=1, default=float)
    print(text)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()

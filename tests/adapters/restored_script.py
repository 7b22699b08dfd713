"""Run by tests/adapters/test_sharding.py in a fresh interpreter (its own gloo process group, of one process): a tiny
BERT classifier sharded with FSDP2 (``fully_shard`` per layer and on the model) explained with ``attribute`` as a
training step would find it; writes to ``OUT_DIR/restored.json`` whether the model holds its sharded parameters
after each method, their ``requires_grad``, and which parameters the next training step's backward reached.

Usage: ``python restored_script.py OUT_DIR``.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import transformers as tf
from torch.distributed.fsdp import fully_shard

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.attribution import attribute


def main(root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/group", rank=0, world_size=1)
    torch.manual_seed(0)
    config = tf.BertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    model = tf.BertForSequenceClassification._from_config(config, attn_implementation="eager")
    for layer in model.bert.encoder.layer:
        fully_shard(layer)
    fully_shard(model)
    trained = dict(model.named_parameters())  # the sharded parameters (what an optimizer holds)
    batch = {
        "input_ids": torch.tensor([[2, 5, 6, 7, 3], [2, 8, 9, 3, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
    }
    adapter = HuggingFaceAdapter(model, check=False)
    found = {}
    for method in ("gradient", "leave_one_out"):
        attribute(adapter, batch, method)
        held = dict(model.named_parameters())
        found[method] = {
            "sharded": all(held[k] is p for k, p in trained.items()),
            "requires_grad": sorted(k for k, p in held.items() if not p.requires_grad),
        }
    model.train()
    model(**batch, labels=torch.tensor([1, 0])).loss.backward()  # a training step after the explanations
    found["no_gradient"] = sorted(k for k, p in trained.items() if p.grad is None)
    with open(os.path.join(root, "restored.json"), "w") as handle:
        json.dump(found, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])

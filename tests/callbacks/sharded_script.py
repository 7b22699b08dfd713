"""Run by tests/callbacks/test_sharded.py in a fresh interpreter: fits of tiny ``transformers`` classifiers sharded with
FSDP2 (``fully_shard`` per layer and on the model, in an unmodified LightningModule's ``configure_model``) under
Lightning's ``ModelParallelStrategy`` on 2 CPU processes (gloo), with and without the audit callbacks; every process
writes the audits' histories and the full (gathered) weights to ``OUT_DIR/<family>_rank<r>.pt``.

Usage: ``python sharded_script.py OUT_DIR FAMILY[,FAMILY...]``; ``FAMILY``: ``bert``, ``llama``, ``bert_penalty``
(the DeceptionPenalty as a training loss, no audit), ``refused`` (audits with methods that cannot explain a
sharded model: what each fit raised) or ``resume`` (BERT with audits for 3 epochs straight, and for 1 epoch saved
to a distributed checkpoint then resumed from it by a fresh Trainer, module and callbacks; ``plain_resume``: the
same without audits). Lightning's launcher re-runs ``sys.argv`` for process 1. The
module also holds the models and data that the test builds unsharded in one process (``python sharded_script.py``
is never imported by the launcher's re-run: the test imports it by path).
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Any, Dict, List

import lightning.pytorch as L
import torch
import transformers as tf
from torch.distributed.fsdp import fully_shard

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit
from lightning_xai.data import read_split
from lightning_xai.losses import DeceptionPenalty

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FUNCTION_WORDS = frozenset({"the", "a", "an", "and", "of", "to", "is", "'s"})
METHODS = ("gradient", "grad_x_input", "integrated_gradients", "leave_one_out")


def tokenizer(root: str) -> tf.BertTokenizerFast:
    """A WordPiece tokenizer whose vocabulary is the 300 most frequent words of the bundled SST-2 train split."""
    counts = collections.Counter(t.lower() for e in read_split("sst2", "train")[:1000] for t in e.tokens)
    # one file per process: both processes build it, and one truncating the shared file while the other read it gave
    # "WordPiece error: Missing [UNK] token from the vocabulary" (a flaky failure of the 2-process tests)
    path = os.path.join(root, f"vocab-{os.getpid()}.txt")
    with open(path, "w") as handle:
        handle.write("\n".join(SPECIALS + [w for w, _ in counts.most_common(300)]) + "\n")
    return tf.BertTokenizerFast(vocab=path, do_lower_case=True)


class SST2(L.LightningDataModule):
    """32 training and 16 validation sentences of the bundled SST-2, with ``impermissible`` marking the function
    words (for the DeceptionPenalty). Sharded, each process trains on every other example (the trainer adds no
    sampler, which would shuffle): a step of batches of 8 on 2 processes reads the 16 examples one process reads in
    one batch of 16."""

    def __init__(self, tokenizer: Any, batch_size: int = 8) -> None:
        super().__init__()
        self.tokenizer, self.batch_size = tokenizer, batch_size

    def _loader(self, split: str, n: int) -> torch.utils.data.DataLoader:
        rank, world = (
            (torch.distributed.get_rank(), torch.distributed.get_world_size())
            if split == "train" and torch.distributed.is_initialized()
            else (0, 1)
        )
        rows = [
            dict(self.tokenizer(" ".join(e.tokens), truncation=True, max_length=32), labels=e.label)
            for e in read_split("sst2", split)[:n]
        ][rank::world]  # this process's share, in order
        collate = tf.DataCollatorWithPadding(self.tokenizer)

        def collate_fn(items: List[Dict[str, Any]]) -> Dict[str, Any]:
            batch = collate(items)
            words = [self.tokenizer.convert_ids_to_tokens(row) for row in batch["input_ids"].tolist()]
            batch["impermissible"] = torch.tensor([[w in FUNCTION_WORDS for w in row] for row in words])
            return batch

        return torch.utils.data.DataLoader(rows, batch_size=self.batch_size, shuffle=False, collate_fn=collate_fn)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return self._loader("train", 32)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return self._loader("val", 16)


def classifier(family: str, vocab_size: int) -> Any:
    """A tiny random ``transformers`` sequence classifier (eager attention), from a config (no download)."""
    if family == "llama":
        config = tf.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
            num_labels=2,
        )
        return tf.LlamaForSequenceClassification._from_config(config, attn_implementation="eager")
    config = tf.BertConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # no dropout: one process and two draw alike
    return tf.BertForSequenceClassification._from_config(config, attn_implementation="eager")


class Classifier(L.LightningModule):
    """The user's module: nothing of lightning_xai in it (but the penalty, where asked); FSDP2 in configure_model."""

    def __init__(self, family: str, vocab_size: int, shard: bool, penalty: bool = False) -> None:
        super().__init__()
        self.model = classifier(family, vocab_size)
        self.shard, self.penalty = shard, DeceptionPenalty(weight=1.0) if penalty else None

    def configure_model(self) -> None:
        if self.shard:
            for layer in (
                self.model.base_model.layers
                if hasattr(self.model.base_model, "layers")
                else self.model.base_model.encoder.layer
            ):
                fully_shard(layer)
            fully_shard(self.model)

    def training_step(self, batch: Dict[str, Any], batch_idx: int) -> torch.Tensor:
        keys = ("input_ids", "attention_mask", "token_type_ids", "labels")
        if self.penalty is None:
            return self.model(**{k: batch[k] for k in keys if k in batch}).loss
        out = HuggingFaceAdapter(self.model, check=False)(batch)  # the penalty reads the model's attention
        loss = torch.nn.functional.cross_entropy(out.logits, batch["labels"])
        return loss + self.penalty(out, batch)

    def validation_step(self, batch: Dict[str, Any], batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


#: the other methods that run on a sharded model, compared on BERT (a second AttentionAudit)
MORE_METHODS = ("smooth_grad", "attnlrp", "attention_flow", "grad_attention", "smooth_attention")


def audits(family: str) -> List[Any]:
    """The audits compared: cheap settings, no cost budget (it would resize the subset after the first audit)."""
    common: Dict[str, Any] = dict(num_samples=8, batch_size=4, budget=None)
    found = [
        AttentionAudit(methods=METHODS, method_options={"integrated_gradients": {"n_steps": 8}}, **common),
        ErasureAudit(rankings=("attention", "attention_gradient", "leave_one_out"), **common),
        AttentionBaselines(num_permutations=4, **common),
    ]
    if family == "bert":
        found.append(AttentionAudit(methods=MORE_METHODS, log_prefix="more", **common))
    return found


def full_weights(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The module's full weights on every process (a sharded DTensor is gathered: a collective)."""
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
        for k, v in module.state_dict().items()
    }


def trainer(root: str, callbacks: List[Any], shard: bool, max_epochs: int = 1) -> L.Trainer:
    from lightning.pytorch.strategies import ModelParallelStrategy

    where: Dict[str, Any] = dict(accelerator="cpu", devices=1)
    if shard:
        where = dict(
            accelerator="cpu", devices=2, strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
        )
    checkpointing = any(isinstance(c, L.callbacks.ModelCheckpoint) for c in callbacks)
    return L.Trainer(
        max_epochs=max_epochs,
        logger=False,
        use_distributed_sampler=False,
        enable_checkpointing=checkpointing,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        callbacks=callbacks,
        deterministic=True,
        **where,
    )


def fit(root: str, family: str, callbacks: List[Any], shard: bool) -> Dict[str, torch.Tensor]:
    tok = tokenizer(root)
    L.seed_everything(0, verbose=False)
    module = Classifier(family.split("_")[0], len(tok), shard, penalty=family.endswith("penalty"))
    trainer(root, callbacks, shard).fit(module, SST2(tok, batch_size=8 if shard else 16))
    return full_weights(module)


def resume_audits() -> List[Any]:
    """The audits of the resume comparison: every epoch, and one every 3 optimizer steps (2 steps an epoch: steps 3
    and 6, both after the resume), no cost budget (it plans from measured seconds, which differ between runs)."""
    common: Dict[str, Any] = dict(num_samples=8, batch_size=4, budget=None)
    return [
        AttentionAudit(methods=("gradient", "leave_one_out"), **common),
        AttentionBaselines(num_permutations=4, **common),
        AttentionAudit(
            methods=("gradient",),
            metrics=("kendall_tau",),
            every_n_epochs=0,
            every_n_train_steps=3,
            on_validate=False,
            on_test=False,
            log_prefix="step_audit",
            **common,
        ),
    ]


def resumed(root: str, family: str) -> Dict[str, Any]:
    """The sharded BERT trained for 3 epochs straight (A), and for 1 epoch with a ``ModelCheckpoint`` (the strategy
    saves a distributed checkpoint: a directory of shards) then resumed from it (B) by a fresh Trainer, module
    (initialised from another seed) and callbacks: each run's full weights and audit histories."""
    tok = tokenizer(root)

    def run(name: str, init_seed: int, epochs: int, callbacks: List[Any], ckpt_path: Any = None) -> Any:
        L.seed_everything(init_seed, verbose=False)
        module = Classifier("bert", len(tok), shard=True)
        trainer(os.path.join(root, name), callbacks, shard=True, max_epochs=epochs).fit(
            module, SST2(tok), ckpt_path=ckpt_path
        )
        return full_weights(module)

    root = os.path.join(root, family)  # its own checkpoint directory (ModelCheckpoint versions an existing name)
    make = resume_audits if family == "resume" else list
    straight, first, second = make(), make(), make()
    weights_a = run("a", 0, 3, straight)
    directory = os.path.join(root, "checkpoints")
    run("b", 0, 1, [*first, L.callbacks.ModelCheckpoint(dirpath=directory, filename="{epoch}", save_top_k=-1)])
    checkpoint = os.path.join(directory, "epoch=0.ckpt")
    weights_b = run("b", 1, 3, second, ckpt_path=checkpoint)
    return {
        "straight": {"weights": weights_a, "histories": [c.history for c in straight]},
        "resumed": {"weights": weights_b, "histories": [c.history for c in second]},
        "checkpoint": sorted(os.listdir(checkpoint)) if os.path.isdir(checkpoint) else checkpoint,
    }


def refusals(root: str) -> Dict[str, str]:
    """What a fit of the sharded BERT raised with each audit whose methods cannot explain a sharded model."""
    refused = {
        "attention_audit": lambda: AttentionAudit(
            methods=("gradient", "alti", "integrated_hessians"), num_samples=4, budget=None
        ),
        "erasure_audit": lambda: ErasureAudit(rankings=("attention", "value_zeroing"), num_samples=4, budget=None),
    }
    outcomes = {}
    for name, make in refused.items():
        try:
            fit(root, "bert", [make()], shard=True)
            outcomes[name] = "finished"
        except Exception as err:  # noqa: BLE001 - what the fit raised is the result
            outcomes[name] = f"{type(err).__name__}: {err}"
    return outcomes


def main(root: str, families: List[str]) -> None:
    torch.set_num_threads(1)
    for family in families:
        if family == "refused":
            torch.save(refusals(root), os.path.join(root, f"refused_rank{torch.distributed.get_rank()}.pt"))
            continue
        if family.endswith("resume"):
            torch.save(resumed(root, family), os.path.join(root, f"{family}_rank{torch.distributed.get_rank()}.pt"))
            continue
        callbacks = [] if family.endswith("penalty") else audits(family)
        audited = fit(root, family, callbacks, shard=True)
        plain = fit(root, family, [], shard=True) if callbacks else audited
        rank = torch.distributed.get_rank()
        torch.save(
            {"audited": audited, "plain": plain, "histories": [c.history for c in callbacks]},
            os.path.join(root, f"{family}_rank{rank}.pt"),
        )
    torch.distributed.barrier()  # gloo torn down before exit (left to interpreter shutdown it can abort)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","))

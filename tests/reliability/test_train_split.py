"""Issue 29, non-invasiveness: auditing the training split leaves training bit-identical wherever the training
dataset keeps its random generator (one object down, in a list), and a resumed run audits and trains exactly as one
run, because the audit never calls ``train_dataloader()`` itself during ``fit``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.utils.data import Dataset

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.callbacks._audit.rows import detached_dataset, preserved_dataset_generators
from lightning_xai.data import TextClassificationDataModule
from lightning_xai.models import AttentionClassifier

_SPEC = importlib.util.spec_from_file_location("callbacks_kit", Path(__file__).parents[1] / "callbacks" / "conftest.py")
kit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kit)


class _Augment:
    def __init__(self) -> None:
        self.rng = torch.Generator().manual_seed(1)


class _WordDropout(Dataset):
    """Replaces 30% of the words by id 1 at every read, drawing from a generator held where ``hold`` says."""

    def __init__(self, base: Dataset, hold: str) -> None:
        self.base = base
        if hold == "nested":
            self.augment = _Augment()  # self.augment.rng: one object down
        else:
            self.generators = [torch.Generator().manual_seed(1)]  # in a list

    def _generator(self) -> torch.Generator:
        return self.augment.rng if hasattr(self, "augment") else self.generators[0]

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        item = dict(self.base[index])
        drop = torch.rand(len(item["input_ids"]), generator=self._generator()) < 0.3
        item["input_ids"] = [1 if d else t for t, d in zip(item["input_ids"], drop.tolist())]
        return item


class _AugmentedSlice(kit.SST2Slice):
    """As users write them: the training dataset is built once and every ``train_dataloader()`` serves it."""

    def __init__(self, hold: str, **kwargs) -> None:
        super().__init__({"train": 96, "val": 16, "test": 16}, batch_size=16, seed=0, **kwargs)
        self.hold = hold
        self._train = None

    def dataset(self, split):
        if split != "train":
            return super().dataset(split)
        if self._train is None:
            self._train = _WordDropout(super().dataset("train"), self.hold)
        return self._train


def _fit_weights(tmp_path, hold, callbacks):
    dm = _AugmentedSlice(hold)
    dm.setup("fit")
    model = kit.make_model(dm)
    kit.make_trainer(tmp_path, callbacks, max_epochs=2).fit(model, dm)
    return model.state_dict()


@pytest.mark.parametrize("hold", ["nested", "list"])
def test_a_train_split_audit_leaves_training_bit_identical_wherever_the_generator_lives(tmp_path, hold):
    audit = AttentionAudit(
        methods=("gradient",), metrics=("kendall_tau",), dataloader="train", num_samples=24, budget=None
    )
    plain = _fit_weights(tmp_path / "plain", hold, [])
    audited = _fit_weights(tmp_path / "audited", hold, [audit])
    assert len(audit.history) == 2
    assert all(torch.equal(plain[k], audited[k]) for k in plain), hold


@pytest.mark.parametrize("hold", ["nested", "list"])
def test_the_attribute_search_alone_misses_these_generators_and_the_copy_does_not(hold):
    data = _WordDropout(kit.make_dm().dataset("train"), hold)
    with preserved_dataset_generators(data):
        data[0]
    moved = data[0]["input_ids"]
    fresh = _WordDropout(kit.make_dm().dataset("train"), hold)
    assert moved != fresh[0]["input_ids"]  # the old guard let the read move the stream (this check can fail)
    again = _WordDropout(kit.make_dm().dataset("train"), hold)
    detached_dataset(again)[0]
    assert again[0]["input_ids"] == _WordDropout(kit.make_dm().dataset("train"), hold)[0]["input_ids"]


# --- resume with a train-split audit -------------------------------------------------------------------------
class _Slice(TextClassificationDataModule):
    sizes = {"train": 96, "val": 16, "test": 16}

    def examples(self, split):
        return super().examples(split)[: self.sizes[split]]


def _resume_fit(tmp_path, init_seed, max_epochs, audit, ckpt_path=None, checkpoint_dir=None):
    pl.seed_everything(init_seed, workers=True, verbose=False)
    dm = _Slice("sst2", batch_size=16, seed=0)
    model = AttentionClassifier(
        dm.vocab_size if dm.setup("fit") is None else 0,
        2,
        embedding_dim=16,
        hidden_dim=8,
        embedding_std=0.3,
        vocab=dm.vocab.itos,
    )
    callbacks = [audit]
    if checkpoint_dir is not None:
        callbacks.append(ModelCheckpoint(dirpath=checkpoint_dir, filename="{epoch}", save_top_k=-1))
    trainer = pl.Trainer(
        max_epochs=max_epochs,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=checkpoint_dir is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        deterministic=True,
    )
    trainer.fit(model, dm, ckpt_path=ckpt_path)
    return model.state_dict()


def _train_audit():
    return AttentionAudit(
        methods=("gradient",), metrics=("kendall_tau",), dataloader="train", num_samples=24, budget=None
    )


def test_resuming_a_run_with_a_train_split_audit_is_exact(tmp_path):
    straight = _train_audit()
    final_a = _resume_fit(tmp_path / "a", 0, 3, straight)
    _resume_fit(tmp_path / "b", 0, 1, _train_audit(), checkpoint_dir=tmp_path / "ckpt")
    resumed = _train_audit()
    final_b = _resume_fit(tmp_path / "b", 1, 3, resumed, ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"))
    assert all(torch.equal(final_a[k], final_b[k]) for k in final_a)
    assert [r["metrics"] for r in resumed.history] == [r["metrics"] for r in straight.history]

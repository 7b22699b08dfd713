"""Shared fixtures: real bundled data (small slices) and a small reference model trained on it once."""

from __future__ import annotations

import os

import pytest
import pytorch_lightning as pl
import torch

from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.models import AttentionClassifier

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def sst2() -> TextClassificationDataModule:
    """The bundled SST-2 data module (batch 16), set up for fitting."""
    dm = TextClassificationDataModule("sst2", batch_size=16, seed=0)
    dm.setup("fit")
    return dm


@pytest.fixture(scope="session")
def sst2_batch(sst2):
    """16 real SST-2 dev sentences of very different lengths, padded into one batch."""
    dataset = sst2.dataset("val")
    return collate([dataset[i] for i in range(16)])


@pytest.fixture(scope="session")
def trained_model(sst2, tmp_path_factory) -> AttentionClassifier:
    """A small BiLSTM + tanh attention classifier trained for one epoch on 1,600 SST-2 sentences (eval mode)."""
    pl.seed_everything(0, verbose=False)
    model = AttentionClassifier(
        sst2.vocab_size, 2, embedding_dim=32, hidden_dim=16, embedding_std=0.3, vocab=sst2.vocab.itos
    )
    subset = torch.utils.data.Subset(sst2.dataset("train"), range(1600))
    loader = torch.utils.data.DataLoader(
        subset, batch_size=32, shuffle=True, collate_fn=collate, generator=torch.Generator().manual_seed(0)
    )
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path_factory.mktemp("trained"),
    )
    trainer.fit(model, loader)
    return model.eval()

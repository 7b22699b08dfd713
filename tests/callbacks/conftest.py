"""Small real SST-2 slices and tiny models for the callback tests."""
from __future__ import annotations

from typing import Dict, Optional

import pytest
import pytorch_lightning as pl

from lightning_xai.data import TextClassificationDataModule
from lightning_xai.data.readers import Example
from lightning_xai.models import AttentionClassifier

# Function words marked "impermissible" so the impermissible-attention monitor has something to measure on SST-2.
IMPERMISSIBLE = frozenset({"the", "a", "an", "and", "of", "to", "is", "'s"})


class SST2Slice(TextClassificationDataModule):
    """The bundled SST-2, cut to the first ``sizes[split]`` examples of each split.

    With ``impermissible=True`` every example carries a mask of the function words in :data:`IMPERMISSIBLE`.
    """

    def __init__(self, sizes: Optional[Dict[str, int]] = None, impermissible: bool = False, **kwargs) -> None:
        super().__init__("sst2", **kwargs)
        self.sizes = sizes or {"train": 192, "val": 48, "test": 48}
        self.impermissible = impermissible

    def examples(self, split):
        examples = super().examples(split)[: self.sizes[split]]
        if self.impermissible:
            examples = [Example(e.tokens, e.label, [int(t.lower() in IMPERMISSIBLE) for t in e.tokens])
                        for e in examples]
        return examples


def make_dm(impermissible: bool = False, batch_size: int = 16, **sizes: int) -> SST2Slice:
    dm = SST2Slice({"train": 192, "val": 48, "test": 48, **sizes}, impermissible=impermissible,
                   batch_size=batch_size, seed=0)
    dm.setup("fit")
    return dm


def make_model(dm: TextClassificationDataModule, seed: int = 0, **kwargs) -> AttentionClassifier:
    pl.seed_everything(seed, verbose=False)
    options = dict(embedding_dim=16, hidden_dim=8, embedding_std=0.3, vocab=dm.vocab.itos)
    options.update(kwargs)
    return AttentionClassifier(dm.vocab_size, 2, **options)


def make_trainer(tmp_path, callbacks=(), **kwargs) -> pl.Trainer:
    options = dict(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=str(tmp_path), num_sanity_val_steps=0,
                   deterministic=True)
    options.update(kwargs)
    return pl.Trainer(callbacks=list(callbacks), **options)


#: cheap options for every attribution method used in the tests
FAST_METHODS = {"integrated_gradients": {"n_steps": 8}}


@pytest.fixture()
def dm() -> SST2Slice:
    return make_dm()


class _Kit:
    """The helpers above, handed to tests as a fixture (test modules cannot import conftest in importlib mode)."""

    make_dm = staticmethod(make_dm)
    make_model = staticmethod(make_model)
    make_trainer = staticmethod(make_trainer)
    FAST_METHODS = FAST_METHODS
    IMPERMISSIBLE = IMPERMISSIBLE


@pytest.fixture()
def kit() -> type:
    return _Kit

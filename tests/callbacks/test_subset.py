"""The audit subset is read without disturbing training: a dataset that draws at every read keeps its stream."""

from __future__ import annotations

import random

import numpy as np
import torch

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.callbacks._audit.rows import preserved_dataset_generators
from lightning_xai.data import MaskedDataModule
from tests.callbacks.conftest import make_dm, make_model, make_trainer


class _OneDatasetPerSplit(MaskedDataModule):
    """As users write them: the datasets are built once and every ``*_dataloader()`` call serves the same one."""

    def dataset(self, split):
        self._built = getattr(self, "_built", {})
        if split not in self._built:
            self._built[split] = super().dataset(split)
        return self._built[split]


def _fit(tmp_path, callbacks):
    dm = _OneDatasetPerSplit(make_dm(train=96, val=16), {}, random_masking=0.5)  # fresh masks at every read
    model = make_model(make_dm(train=96, val=16), dropout=0.3)
    make_trainer(tmp_path, callbacks, max_epochs=2).fit(model, dm)
    return model.state_dict()


def test_auditing_the_masked_training_split_leaves_training_bit_identical(tmp_path):
    audit = AttentionAudit(
        methods=("gradient",), metrics=("kendall_tau",), dataloader="train", num_samples=24, budget=None
    )
    plain = _fit(tmp_path / "plain", [])
    audited = _fit(tmp_path / "audited", [audit])
    assert len(audit.history) == 2  # the audit ran (and read the masked training items) every epoch
    assert plain.keys() == audited.keys()
    assert all(torch.equal(plain[k], audited[k]) for k in plain)


def test_every_kind_of_generator_a_dataset_wraps_is_restored():
    class Draws(torch.utils.data.Dataset):
        def __init__(self):
            self.torch_gen = torch.Generator().manual_seed(0)
            self.py_gen = random.Random(0)
            self.np_state = np.random.RandomState(0)
            self.np_gen = np.random.default_rng(0)

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return (
                float(torch.rand((), generator=self.torch_gen)),
                self.py_gen.random(),
                self.np_state.rand(),
                self.np_gen.random(),
            )

    data = Draws()
    wrapped = torch.utils.data.ConcatDataset([torch.utils.data.Subset(data, [0, 1]), [9]])
    with preserved_dataset_generators(wrapped):
        first = data[0]
    assert data[0] == first
    data[0]
    assert data[0] != first  # without the guard the draws move on (the test can fail)

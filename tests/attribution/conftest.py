"""Fixtures for the attribution tests: the session's trained reference model in float64, real SST-2 batches."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="module")
def model64(trained_model):
    """A float64 copy of the trained reference model (BiLSTM 16/direction + tanh attention), eval mode."""
    return copy.deepcopy(trained_model).double().eval()


@pytest.fixture(scope="module")
def batch16(sst2_batch):
    """16 real SST-2 dev sentences (copy, so no test mutates the session fixture)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in sst2_batch.items()}


@pytest.fixture(scope="module")
def batch8(batch16):
    """The first 8 sentences, trimmed to their longest one (for the slower oracles)."""
    width = int(batch16["mask"][:8].sum(1).max())
    return {k: (v[:8, :width] if v.dim() == 2 else v[:8]).clone() for k, v in batch16.items()}

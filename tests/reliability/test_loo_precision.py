"""Leave-one-out under bf16 is not silent (issue 29, "silent wrong numbers").

Before, ``attribute(model, batch, "leave_one_out")`` under bf16 autocast or on a bf16 model returned a map whose
per-sentence τ against the float32 map fell to 0.12, without a word. The map is still computed as asked (the
callbacks' ``precision="trainer"`` option relies on it) but with a warning that says how to get the float32
one; the maps are compared with the float32 oracle to show why.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from lightning_xai.attribution import attribute
from lightning_xai.data import collate
from lightning_xai.data.readers import read_split
from lightning_xai.data.vocabulary import Vocabulary
from lightning_xai.models import AttentionClassifier


@pytest.fixture(scope="module")
def model_and_batch():
    texts = [e.tokens for e in read_split("sst2", "val")[:8]]
    vocab = Vocabulary.build(texts)
    batch = collate(
        [{"input_ids": vocab.encode(t), "mask": [1] * len(t), "labels": 0, "index": i} for i, t in enumerate(texts)]
    )
    torch.manual_seed(0)
    model = AttentionClassifier(len(vocab), 2, embedding_dim=32, hidden_dim=16, encoder="cnn").eval()
    return model, batch


def _loo(model, batch):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scores = attribute(model, batch, "leave_one_out", target=0)
    return scores.float(), [
        str(w.message) for w in caught if "leave_one_out" in str(w.message) and "rounding" in str(w.message)
    ]


def test_float32_is_quiet_bf16_autocast_and_bf16_weights_warn(model_and_batch):
    model, batch = model_and_batch
    oracle, quiet = _loo(model, batch)
    assert quiet == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed, said = _loo(model, batch)
    assert len(said) == 1 and "under bfloat16 autocast" in said[0] and "enabled=False" in said[0]
    rough, said_weights = _loo(copy.deepcopy(model).to(torch.bfloat16), batch)
    assert len(said_weights) == 1 and "on a model with bfloat16 weights" in said_weights[0]
    assert "model.float()" in said_weights[0]
    # why: the bf16 maps are not the float32 map (the difference the warning is about)
    assert float((mixed - oracle).abs().max()) > 1e-4 and float((rough - oracle).abs().max()) > 1e-4


def test_the_fix_the_warning_names_gives_the_float32_map(model_and_batch):
    model, batch = model_and_batch
    oracle, _ = _loo(model, batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            fixed, said = _loo(model, batch)
    assert said == []
    torch.testing.assert_close(fixed, oracle, rtol=0, atol=0)

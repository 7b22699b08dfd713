"""Masked fine-tuning data (RandomMaskingDataset and MaskedDataModule(random_masking=...)) on real SST-2 sentences:
reproducible draws, the expected share of masked tokens, specials and one real token always kept."""

from __future__ import annotations

import pytest
import torch

from lightning_xai.data import MaskedDataModule, TextClassificationDataModule
from lightning_xai.data.masking import RandomMaskingDataset


@pytest.fixture(scope="module")
def wrapped():
    dm = TextClassificationDataModule("sst2", batch_size=32, add_sos_eos=True)
    dm.setup("fit")
    return dm


def test_draws_are_reproducible_and_fresh_at_every_read(wrapped):
    data = wrapped.dataset("train")
    a = RandomMaskingDataset(data, 1.0, unk_id=1, seed=3)
    b = RandomMaskingDataset(data, 1.0, unk_id=1, seed=3)
    first = [a[i]["input_ids"] for i in range(50)]
    assert first == [b[i]["input_ids"] for i in range(50)]
    assert first != [a[i]["input_ids"] for i in range(50)]  # a second read draws new masks


def test_share_specials_and_survivors(wrapped):
    data = wrapped.dataset("train")
    masked = RandomMaskingDataset(data, 0.5, unk_id=1, seed=0)
    n = 2000
    touched, shares = 0, []
    for i in range(n):
        item, original = masked[i], data[i]
        real = [p for p, r in enumerate(original["mask"]) if r]
        changed = [p for p, (x, y) in enumerate(zip(item["input_ids"], original["input_ids"])) if x != y]
        assert all(original["mask"][p] for p in changed)  # <sos>/<eos> never masked
        assert all(item["input_ids"][p] == 1 for p in changed)
        assert len(changed) < len(real) or len(real) == 0
        already_unk = sum(original["input_ids"][p] == 1 for p in real)
        masked_count = sum(item["input_ids"][p] == 1 for p in real) - already_unk
        if masked_count:
            touched += 1
            shares.append(masked_count / len(real))
    # half the items masked (one-token sentences cannot be), the masked share uniform on (0, 1): mean ≈ 0.5
    assert 0.42 < touched / n < 0.55
    assert 0.4 < sum(shares) / len(shares) < 0.6


def test_datamodule_option_masks_only_the_training_split(wrapped):
    dm = MaskedDataModule(wrapped, {}, random_masking=1.0)
    train = next(iter(dm.train_dataloader()))
    plain = next(iter(wrapped.train_dataloader()))  # same seed, same shuffle order
    assert torch.equal(train["index"], plain["index"])
    assert int((train["input_ids"] == 1).sum()) > int((plain["input_ids"] == 1).sum())
    val = next(iter(dm.val_dataloader()))
    assert torch.equal(val["input_ids"], next(iter(wrapped.val_dataloader()))["input_ids"])
    with pytest.raises(ValueError, match="random_masking"):
        MaskedDataModule(wrapped, {}, random_masking=2.0)
    with pytest.raises(ValueError, match="probability"):
        RandomMaskingDataset(wrapped.dataset("val"), -0.1)

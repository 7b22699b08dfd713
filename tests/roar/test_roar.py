"""Remove-and-retrain on a slice of real SST-2: the masks follow the base model's own ranking (recomputed by hand),
no ranked token survives in the retrain data (unk and delete), the same seed gives the same accuracies, and the
masking rule's edge cases and errors."""

from __future__ import annotations

import pytest
import torch

from lightning_xai.data import TextClassificationDataModule, read_split
from lightning_xai.data.masking import MaskedDataModule, MaskedDataset, top_positions
from lightning_xai.models import AttentionClassifier
from lightning_xai.roar import rank_split, remove_and_retrain, roar_positions

TRAINER = {"max_epochs": 1, "limit_val_batches": 1}


@pytest.fixture(scope="module")
def slice_dm(tmp_path_factory):
    """200 train / 48 val / 64 test SST-2 sentences, as the user's own TSV files."""
    root = tmp_path_factory.mktemp("sst2_slice")
    paths = {}
    for split, source, n in (("train", "train", 200), ("val", "val", 48), ("test", "test", 64)):
        path = root / f"{split}.tsv"
        rows = ["sentence\tlabel"] + [f"{' '.join(e.tokens)}\t{e.label}" for e in read_split("sst2", source)[:n]]
        path.write_text("\n".join(rows) + "\n")
        paths[f"{split}_path"] = str(path)
    dm = TextClassificationDataModule(batch_size=32, seed=0, **paths)
    dm.setup("fit")
    return dm


def _make(dm):
    return lambda: AttentionClassifier(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3)


def test_same_seed_same_accuracies_and_masks(slice_dm):
    kwargs = dict(rankings=("attention", "random"), fractions=(0.3, 0.7), seeds=(0,), trainer_kwargs=TRAINER)
    first = remove_and_retrain(slice_dm, _make(slice_dm), **kwargs)
    second = remove_and_retrain(slice_dm, _make(slice_dm), **kwargs)
    assert first.accuracy == second.accuracy and first.base_accuracy == second.base_accuracy
    assert first.positions == second.positions
    assert set(first.accuracy) == {"attention", "random"}
    assert all(set(v) == {0.3, 0.7} for v in first.accuracy.values())
    # attention and random pick different tokens, so they are different experiments
    assert first.positions["attention"][0.7]["train"] != first.positions["random"][0.7]["train"]
    table = first.table()
    assert table.count("\n") == 3 and "| attention |" in table and "70%" in table


def test_masks_follow_the_base_models_ranking_and_remove_every_ranked_token(slice_dm):
    torch.manual_seed(0)
    model = _make(slice_dm)().eval()
    data = slice_dm.dataset("train")
    scores = rank_split(model, data, "attention", batch_size=16)
    positions = roar_positions(scores, data, 0.5)
    unk = slice_dm.vocab.stoi["<unk>"]
    masked_unk = MaskedDataset(data, positions, "unk", unk_id=unk)
    masked_del = MaskedDataset(data, positions, "delete")
    for i in range(0, len(data), 7):
        item = data[i]
        n = len(item["input_ids"])
        batch = {"input_ids": torch.tensor([item["input_ids"]]), "mask": torch.ones(1, n, dtype=torch.bool)}
        with torch.no_grad():
            attention = model(batch).attention[0]
        k = -(-n // 2)  # ceil(n / 2), at most n - 1
        k = min(k, n - 1)
        expected = sorted(torch.argsort(-attention, stable=True)[:k].tolist())
        assert positions[i] == expected
        ids = masked_unk[i]["input_ids"]
        assert all(ids[p] == unk for p in expected) and len(ids) == n
        kept = [w for p, w in enumerate(item["input_ids"]) if p not in expected]
        assert masked_del[i]["input_ids"] == kept and len(masked_del[i]["mask"]) == n - k
    # the data module serves the masked splits
    dm = MaskedDataModule(slice_dm, {"train": positions}, "unk")
    served = torch.cat([b["input_ids"][b["mask"]] for b in dm.train_dataloader()])
    assert int((served == unk).sum()) >= sum(len(p) for p in positions)


def test_top_positions_edge_cases():
    assert top_positions([0.2, 0.2, 0.1], [True, True, True], 0.3) == [0]  # ties: the earlier position
    assert top_positions([5.0, 1.0], [True, True], 0.9) == [0]  # one real token always survives
    assert top_positions([9.0, 1.0, 2.0], [False, True, True], 0.5) == [2]  # specials are never masked
    assert top_positions([1.0], [True], 0.5) == []
    with pytest.raises(ValueError, match="fraction"):
        top_positions([1.0], [True], 1.0)


def test_clear_errors(slice_dm):
    with pytest.raises(ValueError, match="fractions"):
        remove_and_retrain(slice_dm, _make(slice_dm), fractions=(0.0,))
    with pytest.raises(ValueError, match="mode"):
        remove_and_retrain(slice_dm, _make(slice_dm), mode="zero")
    with pytest.raises(ValueError, match="one list of positions per item"):
        MaskedDataset(slice_dm.dataset("val"), [[0]])
    with pytest.raises(ValueError, match="splits"):
        MaskedDataModule(slice_dm, {"dev": []})

"""Token masking of whole splits: remove-and-retrain data (Hooker et al. 2019) served as a data module.

Remove-and-retrain masks, in *every* train/val/test example, the tokens a ranking puts first, then trains a fresh
model on the masked data: if accuracy falls faster than under a random ranking, the ranked tokens carried
information the model needs — the out-of-distribution objection to erasure does not apply, because the model
was trained on masked inputs. This module only edits data; the training procedure is :mod:`lightning_xai.roar`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from lightning_xai.data.datamodule import SPLITS, collate
from lightning_xai.data.loaders import LoaderSettings, SplitLoaders
from lightning_xai.data.vocabulary import UNK

__all__ = ["MASK_MODES", "MaskedDataModule", "MaskedDataset", "RandomMaskingDataset", "top_positions"]

MASK_MODES = ("unk", "delete")
_PER_TOKEN = ("input_ids", "mask", "impermissible", "rationale")


def top_positions(scores: Sequence[float], real: Sequence[bool], fraction: float) -> List[int]:
    """Positions of the ``ceil(fraction · n)`` highest-scoring real tokens (n real tokens; ties: earlier first).

    ``ceil`` makes every example lose at least one token at any fraction > 0, as ROAR masks a share of every
    input; at most ``n − 1`` tokens are taken, so no example is left without a real token.

    Example:
        >>> top_positions([0.1, 0.9, 0.5, 7.0], [True, True, True, False], 0.5)
        [1, 2]
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction must lie in [0, 1); got {fraction}.")
    candidates = [p for p, is_real in enumerate(real) if is_real]
    k = min(math.ceil(fraction * len(candidates) - 1e-9), max(0, len(candidates) - 1))
    order = sorted(candidates, key=lambda p: (-float(scores[p]), p))
    return sorted(order[:k])


class MaskedDataset(Dataset):
    """``dataset`` with, in item ``i``, the positions ``positions[i]`` masked.

    Args:
        dataset: a map-style dataset of encoded items (dicts with ``input_ids``/``mask`` lists, as
            :class:`~lightning_xai.data.datamodule.EncodedDataset` gives).
        positions: per item, the positions (indices into its ``input_ids``) to mask.
        mode: ``"unk"`` replaces the word by ``<unk>`` (the length stays, the word is gone); ``"delete"`` removes
            the position from every per-token list (``input_ids``, ``mask``, ``impermissible``, ``rationale``).
        unk_id: the id written in ``"unk"`` mode.

    Example:
        >>> items = [{"input_ids": [5, 6, 7], "mask": [True, True, True], "labels": 1, "index": 0}]
        >>> MaskedDataset(items, [[1]], unk_id=1)[0]["input_ids"], MaskedDataset(items, [[1]], "delete")[0]["mask"]
        ([5, 1, 7], [True, True])
    """

    def __init__(self, dataset: Any, positions: Sequence[Sequence[int]], mode: str = "unk", unk_id: int = 1) -> None:
        if mode not in MASK_MODES:
            raise ValueError(f"mode must be one of {MASK_MODES}, got {mode!r}.")
        if len(positions) != len(dataset):
            raise ValueError(
                f"positions has {len(positions)} entries but the dataset {len(dataset)} items; give one "
                "list of positions per item."
            )
        self.dataset = dataset
        self.positions = [sorted(set(int(p) for p in row)) for row in positions]
        self.mode = mode
        self.unk_id = int(unk_id)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        item = dict(self.dataset[index])
        drop = self.positions[index]
        if not drop:
            return item
        if max(drop) >= len(item["input_ids"]):
            raise IndexError(f"item {index} has {len(item['input_ids'])} positions; cannot mask position {max(drop)}.")
        if self.mode == "unk":
            ids = list(item["input_ids"])
            for p in drop:
                ids[p] = self.unk_id
            item["input_ids"] = ids
            return item
        gone = set(drop)
        for key in _PER_TOKEN:
            if key in item:
                item[key] = [v for p, v in enumerate(item[key]) if p not in gone]
        return item


class RandomMaskingDataset(Dataset):
    """Masked fine-tuning (Madsen et al. 2024): ``dataset`` with random tokens masked, fresh masks at every read.

    With probability ``probability`` an item is masked: a share u ~ Uniform(0, 1) is drawn and ⌈u·n⌉ of its n real
    tokens (at most n − 1) become ``<unk>``; other items are served unchanged. Training on such inputs puts the
    erased inputs of faithfulness metrics (and of remove-and-retrain) inside the training distribution. The
    draws come from one generator seeded with ``seed``, so with a seeded shuffle and ``num_workers=0`` a run is
    reproducible; wrap only the training split.

    Example:
        >>> items = [{"input_ids": [5, 6, 7, 8], "mask": [True] * 4, "labels": 1, "index": 0}]
        >>> data = RandomMaskingDataset(items, probability=1.0, unk_id=1, seed=0)
        >>> masked = [data[0]["input_ids"] for _ in range(3)]
        >>> all(1 in ids and ids != [1, 1, 1, 1] for ids in masked)
        True
    """

    def __init__(self, dataset: Any, probability: float = 0.5, unk_id: int = 1, seed: int = 0) -> None:
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must lie in [0, 1]; got {probability}.")
        self.dataset = dataset
        self.probability = float(probability)
        self.unk_id = int(unk_id)
        self.generator = torch.Generator().manual_seed(int(seed))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        item = dict(self.dataset[index])
        if float(torch.rand((), generator=self.generator)) >= self.probability:
            return item
        share = float(torch.rand((), generator=self.generator))
        scores = torch.rand(len(item["input_ids"]), generator=self.generator).tolist()
        drop = set(top_positions(scores, item["mask"], min(share, 1.0 - 1e-9)))
        item["input_ids"] = [self.unk_id if p in drop else w for p, w in enumerate(item["input_ids"])]
        return item


class MaskedDataModule(SplitLoaders, pl.LightningDataModule):
    """A :class:`~lightning_xai.data.TextClassificationDataModule` whose splits are masked at given positions.

    Loaders use the base module's batch size, seed and collate; ``vocab``, ``vocab_size`` and ``num_classes`` are
    the base module's (the vocabulary does not change: masked words become ``<unk>`` or disappear).

    Args:
        base: the data module to mask (set up or not).
        positions: ``{split: per-item position lists}`` for the splits to mask; other splits are served unmasked.
        mode: see :class:`MaskedDataset`.
        random_masking: masked fine-tuning: the training split is also served through
            :class:`RandomMaskingDataset` with this probability (0: off);
            ``MaskedDataModule(dm, {}, random_masking=0.5)`` is ``dm`` with masked fine-tuning.

    Example:
        >>> from lightning_xai.data import TextClassificationDataModule
        >>> dm = TextClassificationDataModule("sst2", batch_size=2)
        >>> n = len(dm.dataset("test"))
        >>> masked = MaskedDataModule(dm, {"test": [[0]] * n})
        >>> batch = next(iter(masked.test_dataloader()))
        >>> batch["input_ids"][:, 0].tolist()
        [1, 1]
    """

    def __init__(
        self,
        base: Any,
        positions: Mapping[str, Sequence[Sequence[int]]],
        mode: str = "unk",
        random_masking: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= random_masking <= 1.0:
            raise ValueError(f"random_masking must lie in [0, 1]; got {random_masking}.")
        self.random_masking = float(random_masking)
        unknown = sorted(set(positions) - set(SPLITS))
        if unknown:
            raise ValueError(f"positions has splits {unknown}; choose among {SPLITS}.")
        if mode not in MASK_MODES:
            raise ValueError(f"mode must be one of {MASK_MODES}, got {mode!r}.")
        self.base = base
        self.positions = {k: list(v) for k, v in positions.items()}
        self.mode = mode

    @property
    def vocab(self) -> Any:
        return self.base.vocab

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    @property
    def num_classes(self) -> int:
        return self.base.num_classes

    def setup(self, stage: Optional[str] = None) -> None:
        self.base.setup(stage)

    def dataset(self, split: str) -> Dataset:
        data = self.base.dataset(split)
        unk = self.base.vocab.stoi[UNK]
        if split in self.positions:
            data = MaskedDataset(data, self.positions[split], self.mode, unk_id=unk)
        if split == "train" and self.random_masking > 0:
            data = RandomMaskingDataset(data, self.random_masking, unk_id=unk, seed=self.base.hparams.seed)
        return data

    def loader_settings(self) -> LoaderSettings:
        hp = self.base.hparams
        return LoaderSettings(hp.batch_size, hp.seed, collate, hp.num_workers)

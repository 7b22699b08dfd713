"""The loader hooks every data module of the package shares: one :class:`SplitLoaders` mixin, not three copies."""
from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Union

import torch
from torch.utils.data import DataLoader

__all__ = ["LoaderSettings", "SplitLoaders"]


class LoaderSettings(NamedTuple):
    """How a data module batches its splits."""

    batch_size: int
    seed: int
    collate_fn: Callable[[List[Any]], Any]
    num_workers: int = 0


class SplitLoaders:
    """``train/val/test/predict_dataloader`` of a ``LightningDataModule`` from its ``dataset(split)``.

    The training split is shuffled by a generator seeded with ``loader_settings().seed`` (reproducible epochs);
    the others keep their order; ``predict`` serves the test split. A split for which ``has_split`` is False
    gives ``[]`` (Lightning then skips that loop). Put the mixin before ``pl.LightningDataModule`` in the bases
    and define ``dataset(split)`` and ``loader_settings()``.

    Example:
        >>> import pytorch_lightning as pl
        >>> class Numbers(SplitLoaders, pl.LightningDataModule):
        ...     def dataset(self, split):
        ...         return list(range(6)) if split == "train" else [7, 8]
        ...     def loader_settings(self):
        ...         return LoaderSettings(batch_size=4, seed=0, collate_fn=torch.tensor)
        >>> [batch.tolist() for batch in Numbers().val_dataloader()]
        [[7, 8]]
        >>> sorted(sum((b.tolist() for b in Numbers().train_dataloader()), []))
        [0, 1, 2, 3, 4, 5]
    """

    def has_split(self, split: str) -> bool:
        """Whether the module has data for ``split`` (all splits by default)."""
        return True

    def split_loader(self, split: str, shuffle: bool = False) -> Union[DataLoader, List[Any]]:
        """The ``DataLoader`` of ``split`` (``[]`` for a split the module does not have)."""
        if not self.has_split(split):
            return []
        settings = self.loader_settings()
        generator = torch.Generator().manual_seed(settings.seed) if shuffle else None
        return DataLoader(self.dataset(split), batch_size=settings.batch_size, shuffle=shuffle,
                          collate_fn=settings.collate_fn, generator=generator, num_workers=settings.num_workers)

    def train_dataloader(self) -> Union[DataLoader, List[Any]]:
        """The training split, shuffled with the module's seed."""
        return self.split_loader("train", shuffle=True)

    def val_dataloader(self) -> Union[DataLoader, List[Any]]:
        """The validation split, in order."""
        return self.split_loader("val")

    def test_dataloader(self) -> Union[DataLoader, List[Any]]:
        """The test split, in order."""
        return self.split_loader("test")

    def predict_dataloader(self) -> Union[DataLoader, List[Any]]:
        """The test split, in order."""
        return self.split_loader("test")

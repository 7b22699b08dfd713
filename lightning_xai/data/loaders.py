"""The loader hooks every data module of the package shares: one :class:`SplitLoaders` mixin, not three copies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, NamedTuple, Optional, Union

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

    Resuming: the shuffle continues one generator over the epochs, so a resumed run, which builds a fresh
    loader, would repeat epoch 0's order. :meth:`state_dict` (which Lightning puts in every checkpoint) holds
    the state of the training loader's generators — the shuffle and a training dataset's own ``generator``
    (e.g. :class:`~lightning_xai.data.masking.RandomMaskingDataset`'s masks) — and the first training loader
    built after :meth:`load_state_dict` starts from it, so a run resumed from an epoch-end checkpoint sees the
    batches of a run that never stopped. (Not restored: with ``reload_dataloaders_every_n_epochs`` each reload
    starts from the seed, as without a resume; a mid-epoch checkpoint restarts the epoch with the next order.)

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

    if TYPE_CHECKING:  # what the host class provides (declared for mypy only: the lookup order stays the host's)
        _training_generators: Dict[str, torch.Generator]
        _restored_generators: Optional[Dict[str, Any]]

        def dataset(self, split: str) -> Any: ...

        def loader_settings(self) -> LoaderSettings: ...

    def has_split(self, split: str) -> bool:
        """Whether the module has data for ``split`` (all splits by default)."""
        return True

    def split_loader(self, split: str, shuffle: bool = False) -> Union[DataLoader, List[Any]]:
        """The ``DataLoader`` of ``split`` (``[]`` for a split the module does not have)."""
        if not self.has_split(split):
            return []
        settings = self.loader_settings()
        dataset = self.dataset(split)
        generator = torch.Generator().manual_seed(settings.seed) if shuffle else None
        if generator is not None:  # shuffle
            self._training_generators = {"shuffle": generator}
            if isinstance(getattr(dataset, "generator", None), torch.Generator):
                self._training_generators["dataset"] = dataset.generator
            restored: Optional[Dict[str, Any]] = getattr(self, "_restored_generators", None)
            trainer = getattr(self, "trainer", None)
            if restored and not getattr(trainer, "reload_dataloaders_every_n_epochs", 0):
                for name, state in restored.items():
                    if name in self._training_generators:
                        self._training_generators[name].set_state(state)
            self._restored_generators = None
        return DataLoader(
            dataset,
            batch_size=settings.batch_size,
            shuffle=shuffle,
            collate_fn=settings.collate_fn,
            generator=generator,
            num_workers=settings.num_workers,
        )

    def state_dict(self) -> Dict[str, Any]:
        """The states of the last training loader's generators (empty before one is built).

        Example:
            >>> import pytorch_lightning as pl
            >>> class Numbers(SplitLoaders, pl.LightningDataModule):
            ...     def dataset(self, split):
            ...         return list(range(6))
            ...     def loader_settings(self):
            ...         return LoaderSettings(batch_size=6, seed=0, collate_fn=torch.tensor)
            >>> run = Numbers()
            >>> loader = run.train_dataloader()
            >>> first = next(iter(loader)).tolist()
            >>> resumed = Numbers()
            >>> resumed.load_state_dict(run.state_dict())
            >>> next(iter(resumed.train_dataloader())).tolist() == next(iter(loader)).tolist() != first
            True
        """
        generators = getattr(self, "_training_generators", {})
        return {"training_generators": {name: g.get_state() for name, g in generators.items()}} if generators else {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Start the next training loader from the generator states of :meth:`state_dict`."""
        self._restored_generators = dict(state_dict.get("training_generators", {}))

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

"""How an audit reads its rows without disturbing training: the random generators a dataset draws from are restored
after each read (a dataset that draws at every read would otherwise serve training other draws), a dataset whose
reads change it is read from a detached copy, and an IterableDataset is read once into the rows it audits.
"""

from __future__ import annotations

import copy
import random
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch.utils.data import IterableDataset

from lightning_xai.attribution.context import preserved_rng_state

__all__ = ["detached_dataset", "preserved_dataset_generators", "row_reader"]


_STATE = {
    torch.Generator: ("get_state", "set_state"),
    random.Random: ("getstate", "setstate"),
    np.random.RandomState: ("get_state", "set_state"),
}


def _generators(dataset: Any, depth: int = 4) -> Iterator[Any]:
    """The random generators a dataset holds as attributes — its own and those of the datasets it wraps
    (``.dataset``/``.datasets``, as ``Subset``, ``ConcatDataset`` and the package's wrappers name them)."""
    seen = set()
    stack = [(dataset, 0)]
    while stack:
        obj, level = stack.pop()
        if id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        for value in list(getattr(obj, "__dict__", {}).values()):
            if isinstance(value, (torch.Generator, random.Random, np.random.RandomState, np.random.Generator)):
                yield value
        inner = getattr(obj, "dataset", None)
        stack += [(inner, level + 1)] if inner is not None else []
        stack += [(d, level + 1) for d in getattr(obj, "datasets", None) or ()]


@contextmanager
def preserved_dataset_generators(dataset: Any) -> Iterator[None]:
    """Restore, on exit, the state of every random generator the dataset holds (see :func:`_generators`).

    The audit reads its subset through ``dataset[index]``; a dataset that draws at every read — e.g.
    :class:`~lightning_xai.data.masking.RandomMaskingDataset`'s fresh masks — would otherwise serve training other
    draws than a run without the audit (weights no longer bit-identical).

    Example:
        >>> class Noisy(torch.utils.data.Dataset):
        ...     generator = None
        ...     def __init__(self):
        ...         self.generator = torch.Generator().manual_seed(0)
        ...     def __getitem__(self, i):
        ...         return float(torch.rand((), generator=self.generator))
        >>> data = Noisy()
        >>> with preserved_dataset_generators(data):
        ...     audited = data[0]
        >>> data[0] == audited
        True
    """
    saved = []
    for gen in _generators(dataset):
        if isinstance(gen, np.random.Generator):
            saved.append((gen.bit_generator, "state", gen.bit_generator.state))
        else:
            get, put = next(v for k, v in _STATE.items() if isinstance(gen, k))
            saved.append((gen, put, getattr(gen, get)()))
    try:
        yield
    finally:
        for gen, put, state in saved:
            if put == "state":
                gen.state = state
            else:
                getattr(gen, put)(state)


def detached_dataset(dataset: Any, owner: str = "audit", split: str = "val") -> Any:
    """A deep copy of ``dataset`` for the audit to read: reading it never moves the original's random state.

    A dataset that draws at every read (fresh masks, augmentation) keeps its generators wherever it likes — as
    attributes, one object down (``self.augment.rng``), in lists — so the audit reads a copy rather than looking
    for them. The copy is made once per split and setup and costs the dataset's memory while the audit batches
    are built (a dataset too large for that can define ``__deepcopy__`` sharing its tensors). A dataset that cannot
    be copied is read in place with the generators :func:`preserved_dataset_generators` finds restored (a stream,
    under the global RNG states restored), and a warning says so.

    Example:
        >>> class Augmented(torch.utils.data.Dataset):
        ...     def __init__(self):
        ...         self.noise = [torch.Generator().manual_seed(0)]  # one level down, in a list
        ...     def __getitem__(self, i):
        ...         return float(torch.rand((), generator=self.noise[0]))
        >>> data = Augmented()
        >>> audited = detached_dataset(data)[0]
        >>> data[0] == audited  # training still gets the first draw
        True
    """
    try:
        return copy.deepcopy(dataset)
    except Exception as err:  # unpicklable members (open files, locks): fall back to the generators found
        rank_zero_warn(
            f"{owner}: the {split!r} dataset {type(dataset).__name__} cannot be deep-copied "
            f"({type(err).__name__}: {err}); the audit reads it in place and restores the random "
            "generators it holds as attributes. Generators held deeper may move: define __deepcopy__ "
            "so the audit can read a copy."
        )
        return dataset if isinstance(dataset, IterableDataset) else _InPlace(dataset)


class _InPlace:
    """Reads ``dataset[index]`` with its attribute generators restored after every read."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __getitem__(self, index: int) -> Any:
        with preserved_dataset_generators(self.dataset):
            return self.dataset[index]


def row_reader(dataset: Any, wanted: Sequence[int], owner: str = "audit", split: str = "val") -> Callable[[int], Any]:
    """``index -> example`` for the ``wanted`` indices: ``dataset[index]``, or for an ``IterableDataset`` the
    examples at those positions of one pass over it (stopped after the last one, global RNG states restored).

    Example:
        >>> class Stream(torch.utils.data.IterableDataset):
        ...     def __iter__(self):
        ...         return iter("abcdef")
        >>> read = row_reader(Stream(), [1, 3])
        >>> read(1), read(3)
        ('b', 'd')
    """
    if not isinstance(dataset, IterableDataset):
        return dataset.__getitem__
    needed, rows = set(wanted), {}
    if needed:
        last = max(needed)
        with preserved_rng_state():
            for position, row in enumerate(dataset):
                if position in needed:
                    rows[position] = row
                if position >= last:
                    break
    if len(rows) < len(needed):
        raise MisconfigurationException(
            f"{owner}: the {split!r} IterableDataset {type(dataset).__name__} ended after {len(rows)} of the "
            f"{len(needed)} audited examples (its __len__ promises more, or num_samples exceeds the stream); set "
            "num_samples to at most the number of examples it yields."
        )
    return rows.__getitem__

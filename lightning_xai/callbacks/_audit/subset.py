"""Which examples an audit reads: the split's dataloader, a fixed subset drawn once, batched within a token budget."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Sized, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.utils.data import IterableDataset

from lightning_xai.attribution.context import preserved_rng_state
from lightning_xai.callbacks._audit.rows import (
    detached_dataset,
    row_reader,
)
from lightning_xai.lightning_compat import MISCONFIGURATION_ERRORS, is_overridden

__all__ = [
    "AUDIT_TOKEN_BUDGET",
    "AuditBatch",
    "AuditSubsets",
    "SPLITS",
    "build_batches",
    "draw_subset",
    "find_loader",
    "join_budget",
    "merge_small_batches",
]

SPLITS = ("train", "val", "test")
#: padded tokens (rows × width) up to which the audit joins loader-sized batches when ``batch_size=None`` (for a
#: model of all-MiniLM-L6-v2's size or larger; a smaller model joins more: :func:`join_budget`)
AUDIT_TOKEN_BUDGET = 8192
#: dense (not embedding) parameters of all-MiniLM-L6-v2, the model :data:`AUDIT_TOKEN_BUDGET` was measured on
JOIN_REFERENCE_PARAMETERS = 10_796_162
#: the most a small model's join budget grows over :data:`AUDIT_TOKEN_BUDGET`
MAX_JOIN_SCALE = 4
#: ``(positions in the audit subset, dataset indices, collated CPU batch)``
AuditBatch = Tuple[List[int], List[int], Dict[str, Any]]


def _first(loader: Any, owner: str, split: str) -> Any:
    """The first of several loaders (a list, or a dict of named loaders), saying which one is audited."""
    if isinstance(loader, (list, tuple, dict)) and len(loader) > 1:
        first = "dataloader_idx 0" if not isinstance(loader, dict) else f"{next(iter(loader))!r}"
        rank_zero_warn(
            f"{owner}: the {split!r} split has {len(loader)} dataloaders; the audit reads only the first "
            f"({first}) and logs it as {split!r}. To audit another, put it first, or give the audit its "
            "own split (dataloader='test' with that loader as test_dataloader())."
        )
    if isinstance(loader, (list, tuple)):
        loader = loader[0] if loader else None
    if isinstance(loader, dict):
        loader = next(iter(loader.values()), None)
    return loader


def _trainer_loader(trainer: "pl.Trainer", split: str, owner: str) -> Any:
    return _first(
        {"train": trainer.train_dataloader, "val": trainer.val_dataloaders, "test": trainer.test_dataloaders}[split],
        owner,
        split,
    )


def find_loader(trainer: "pl.Trainer", split: str, owner: str = "audit") -> Any:
    """The first dataloader of ``split``, found through Lightning's public API, in this order:

    1. ``trainer.datamodule.<split>_dataloader()`` (not for ``"train"`` during ``fit``: there the loader is the one
       Lightning builds, 2. or 4., so the data module's ``train_dataloader()`` runs once, as without the audit);
    2. the loader the trainer holds (``trainer.train_dataloader`` / ``val_dataloaders`` / ``test_dataloaders``);
    3. the LightningModule's own ``<split>_dataloader()`` hook, if it overrides it;
    4. during ``fit``, for loaders handed to ``trainer.fit(model, train_loader, val_loader)`` that the loop has
       not loaded yet (an audit at ``on_fit_start`` or after a step before the first validation): the loop's
       ``setup_data()`` — what Lightning itself calls before the loop's first batch — then 2. again. (With
       ``limit_val_batches=0`` Lightning loads no validation loader at all: pass a datamodule.)

    Raises:
        MisconfigurationException: no loader of ``split`` can be found (saying how to provide one).

    Example:
        >>> trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
        >>> find_loader(trainer, "val", "AttentionAudit")
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit found no 'val' dataloader to audit; pass a datamodule with val_dataloader() or set dataloader= to a split the trainer has.
    """
    loader = None
    datamodule = getattr(trainer, "datamodule", None)
    # the training loader of a fit is the one Lightning builds (4.): a second train_dataloader() call could move
    # the state the data module checkpoints (its shuffle generator, a restored state it applies once)
    fitting_train = split == "train" and trainer.state.fn == "fit"
    if datamodule is not None and hasattr(datamodule, f"{split}_dataloader") and not fitting_train:
        try:
            loader = _first(getattr(datamodule, f"{split}_dataloader")(), owner, split)
        except MISCONFIGURATION_ERRORS + (ValueError,):
            loader = None
    if loader is None:
        loader = _trainer_loader(trainer, split, owner)
    module = trainer.lightning_module
    if loader is None and module is not None and is_overridden(f"{split}_dataloader", module) and not fitting_train:
        loader = _first(getattr(module, f"{split}_dataloader")(), owner, split)
    if loader is None and trainer.state.fn == "fit" and split in ("train", "val"):
        loop = trainer.fit_loop if split == "train" else trainer.fit_loop.epoch_loop.val_loop
        with preserved_rng_state():
            loop.setup_data()
        loader = _trainer_loader(trainer, split, owner)
    if loader is None:
        unloaded = (
            " (with limit_val_batches=0 Lightning never loads the val_dataloaders given to fit)"
            if split == "val" and trainer.limit_val_batches == 0
            else ""
        )
        raise MisconfigurationException(
            f"{owner} found no {split!r} dataloader to audit{unloaded}; pass a datamodule with "
            f"{split}_dataloader() or set dataloader= to a split the trainer has."
        )
    return loader


def draw_subset(
    dataset: Any, num_samples: Optional[int], seed: int, owner: str = "audit", split: str = "val"
) -> List[int]:
    """``num_samples`` dataset indices (all when ``None``) drawn with a generator seeded by ``seed``, sorted.

    An ``IterableDataset`` is read by position in its iteration order (it must yield the same order every time):
    with ``__len__`` the positions are drawn as for a map-style dataset; a stream without ``__len__`` gives its
    first ``num_samples`` examples (``num_samples=None`` is refused: the stream may never end).

    Example:
        >>> draw_subset(list(range(10)), 4, seed=0)
        [1, 4, 5, 7]
    """
    if isinstance(dataset, IterableDataset):
        try:  # a stream's __len__ may exist and still raise TypeError (it cannot say)
            length = len(dataset) if isinstance(dataset, Sized) else None
        except TypeError:
            length = None
        if length is None:
            if num_samples is None:
                raise MisconfigurationException(
                    f"{owner}: the {split!r} dataloader's {type(dataset).__name__} is an IterableDataset without "
                    "__len__, so the whole split cannot be drawn from; set num_samples=N to audit its first N "
                    "examples, or define __len__."
                )
            return list(range(num_samples))
        size = length
    elif not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise MisconfigurationException(
            f"{owner} needs a map-style dataset (with __len__ and __getitem__) for its fixed "
            f"audit subset; the {split!r} dataloader has {type(dataset).__name__}."
        )
    else:
        size = len(dataset)
    count = size if num_samples is None else min(num_samples, size)
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(size, generator=generator)[:count].tolist())


def build_batches(
    loader: Any,
    indices: Sequence[int],
    positions: Sequence[int],
    batch_size: Optional[int],
    token_budget: int = AUDIT_TOKEN_BUDGET,
    owner: str = "audit",
    split: str = "val",
) -> List[AuditBatch]:
    """The audit subset positions ``positions`` (this process's shard) as collated CPU batches.

    With ``batch_size=None`` the loader's batch size is used and consecutive batches are joined while the padded
    batch holds at most ``token_budget`` tokens (:func:`merge_small_batches`).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> data = [{"input_ids": torch.ones(3, dtype=torch.long)} for _ in range(5)]
        >>> collate = lambda rows: {"input_ids": torch.stack([r["input_ids"] for r in rows])}
        >>> loader = DataLoader(data, batch_size=2, collate_fn=collate)
        >>> [(pos, b["input_ids"].shape[0]) for pos, _, b in build_batches(loader, range(5), range(5), None, 6)]
        [([0, 1], 2), ([2, 3], 2), ([4], 1)]
    """
    collate = getattr(loader, "collate_fn", None)
    if collate is None:
        raise MisconfigurationException(f"{owner}: the {split!r} dataloader has no collate_fn.")
    size = batch_size or getattr(loader, "batch_size", None) or 32
    positions = list(positions)
    # tensors built in validate/test must not be inference tensors; a dataset that draws at every read (random
    # masks, augmentation) must serve training the draws it would have served without the audit: the rows are
    # read from a copy of the dataset, whatever generators it holds and wherever it holds them
    with torch.inference_mode(False), preserved_rng_state():
        rows = row_reader(detached_dataset(loader.dataset, owner, split), [indices[p] for p in positions], owner, split)
        groups = [positions[start : start + size] for start in range(0, len(positions), size)]
        if batch_size is None:
            groups = merge_small_batches(groups, indices, loader, token_budget, rows=rows)
        return [(pos, [indices[p] for p in pos], collate([rows(indices[p]) for p in pos])) for pos in groups]


class AuditSubsets:
    """The fixed audit subset of every split one callback audits: the dataset indices drawn once from its seed
    (checkpointed; a resumed run warns when its draw differs from the checkpoint's), and this process's shard of
    them as collated CPU batches (drawn again when the callback is set up again).

    Args:
        owner: the callback's class name, for messages.

    Example:
        >>> subsets = AuditSubsets("AttentionAudit")
        >>> subsets.load_state_dict({"val": [1, 4, 5, 7]})   # compared with the next draw of "val"
        >>> subsets.state_dict(), subsets.audited("val"), subsets.restored
        ({}, 0, {'val': [1, 4, 5, 7]})
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.indices: Dict[str, List[int]] = {}
        self.batches: Dict[str, List[AuditBatch]] = {}
        self.restored: Dict[str, List[int]] = {}

    def draw(self, split: str, dataset: Any, size: Optional[int], seed: int) -> List[int]:
        """The subset of ``split``: ``size`` indices of ``dataset`` drawn from ``seed`` (:func:`draw_subset`)."""
        chosen = draw_subset(dataset, size, seed, self.owner, split)
        restored = self.restored.get(split)
        if restored is not None and restored != chosen:
            rank_zero_warn(
                f"{self.owner}: the {split!r} audit subset differs from the checkpoint's "
                "(the dataset changed?); the resumed history mixes two subsets."
            )
        self.indices[split] = chosen
        return chosen

    def shard(
        self,
        trainer: "pl.Trainer",
        split: str,
        loader: Any,
        indices: List[int],
        batch_size: Optional[int],
        token_budget: int = AUDIT_TOKEN_BUDGET,
        replicated: bool = False,
    ) -> List[AuditBatch]:
        """This process's positions of ``indices`` as collated CPU batches of ``loader`` (:func:`build_batches`);
        ``replicated``: every position, on every process (a sharded model, whose passes are collectives)."""
        every = list(range(len(indices)))
        positions = every if replicated else every[trainer.global_rank :: max(1, trainer.world_size)]
        self.batches[split] = build_batches(loader, indices, positions, batch_size, token_budget, self.owner, split)
        return self.batches[split]

    def audited(self, split: str) -> int:
        """How many examples the subset of ``split`` holds (0: not drawn yet)."""
        return len(self.indices.get(split, ()))

    def forget(self, split: str) -> None:
        """Drop the subset of ``split`` and its batches: the next audit draws it again (the budget shrank it)."""
        self.indices.pop(split, None)
        self.batches.pop(split, None)

    def state_dict(self) -> Dict[str, List[int]]:
        """The drawn indices of every split."""
        return {k: list(v) for k, v in self.indices.items()}

    def load_state_dict(self, saved: Dict[str, List[int]]) -> None:
        """A checkpoint's subsets, kept to compare the next draws with."""
        self.restored = {k: list(v) for k, v in saved.items()}


def dense_parameters(module: nn.Module) -> int:
    """The parameters of ``module`` outside its ``nn.Embedding`` modules (a shared one counted once; a sharded one
    at its full size): what a pass computes with per token, where an embedding table is only looked up.

    Example:
        >>> dense_parameters(nn.Sequential(nn.Embedding(100, 4), nn.Linear(4, 2)))
        10
    """
    looked_up = {id(p) for m in module.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in module.parameters() if id(p) not in looked_up)


def join_budget(module: Any, token_budget: int = AUDIT_TOKEN_BUDGET) -> int:
    """The padded tokens up to which the audit joins loader batches for ``module``: ``token_budget`` for a model
    with at least all-MiniLM-L6-v2's dense parameters (:data:`JOIN_REFERENCE_PARAMETERS`), and
    ``token_budget × √(reference / dense parameters)``, at most :data:`MAX_JOIN_SCALE` times it, for a smaller one.

    A smaller model computes less per token, so the fixed cost of each pass (Python, the model's module calls)
    weighs more in its audit: on the two-layer LoRA Llama of ``benchmarks/``, joining its 256 audited sentences
    into one batch instead of two at 8,192 tokens cut an ``ErasureAudit`` by 12 % (benchmarks/README.md). The
    budget grows with the square root of the ratio: for a transformer no deeper than MiniLM's 6 layers (parameters
    ∝ layers × width², activations per token ∝ layers × width) a joined pass then holds no more activations than
    MiniLM's at ``token_budget``. Loader batches are never split, whatever the budget.

    Example:
        >>> join_budget(nn.Linear(4, 2)), join_budget(nn.Linear(4096, 4096))
        (32768, 8192)
    """
    if not isinstance(module, nn.Module):
        return token_budget
    dense = max(dense_parameters(module), 1)
    scale = min(MAX_JOIN_SCALE, max(1.0, (JOIN_REFERENCE_PARAMETERS / dense) ** 0.5))
    return int(token_budget * scale)


def merge_small_batches(
    groups: List[List[int]],
    indices: Sequence[int],
    loader: Any,
    token_budget: int = AUDIT_TOKEN_BUDGET,
    *,
    rows: Optional[Callable[[int], Any]] = None,
) -> List[List[int]]:
    """Join consecutive loader-sized groups while the padded batch stays within ``token_budget`` tokens.

    Fewer, larger passes make the audit faster (per-pass overhead dominates small batches of short texts)
    while long documents keep the loader's batch size, so memory stays bounded. ``rows`` reads an example by
    index (default ``loader.dataset[index]``; see :func:`row_reader`).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> collate = lambda rows: {"input_ids": torch.stack(rows)}
        >>> loader = DataLoader([torch.ones(4)] * 6, collate_fn=collate)
        >>> merge_small_batches([[0, 1], [2, 3], [4, 5]], range(6), loader, token_budget=16)
        [[0, 1, 2, 3], [4, 5]]
    """
    read = rows or loader.dataset.__getitem__

    def width(pos: List[int]) -> int:
        batch = loader.collate_fn([read(indices[p]) for p in pos])
        widths = [v.shape[1] for v in batch.values() if isinstance(v, Tensor) and v.dim() >= 2]
        return max(widths, default=1)

    merged: List[List[int]] = []
    current: List[int] = []
    current_width = 0
    for group in groups:
        group_width = width(group)
        joined_width = max(current_width, group_width)
        if current and (len(current) + len(group)) * joined_width > token_budget:
            merged.append(current)
            current, joined_width = [], group_width
        current = current + group
        current_width = joined_width
    if current:
        merged.append(current)
    return merged

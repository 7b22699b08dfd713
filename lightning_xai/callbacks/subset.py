"""Which examples an audit reads: the split's dataloader, a fixed subset drawn once, batched within a token budget."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_xai.attribution.context import preserved_rng_state
from lightning_xai.lightning_compat import MISCONFIGURATION_ERRORS, is_overridden

__all__ = ["AUDIT_TOKEN_BUDGET", "AuditBatch", "SPLITS", "build_batches", "draw_subset", "find_loader",
           "merge_small_batches"]

SPLITS = ("train", "val", "test")
#: padded tokens (rows × width) up to which the audit joins loader-sized batches when ``batch_size=None``
AUDIT_TOKEN_BUDGET = 8192
#: ``(positions in the audit subset, dataset indices, collated CPU batch)``
AuditBatch = Tuple[List[int], List[int], Dict[str, Any]]


def _first(loader: Any) -> Any:
    if isinstance(loader, (list, tuple)):
        loader = loader[0] if loader else None
    if isinstance(loader, dict):
        loader = next(iter(loader.values()), None)
    return loader


def _trainer_loader(trainer: "pl.Trainer", split: str) -> Any:
    return _first({"train": trainer.train_dataloader, "val": trainer.val_dataloaders,
                   "test": trainer.test_dataloaders}[split])


def find_loader(trainer: "pl.Trainer", split: str, owner: str = "audit") -> Any:
    """The first dataloader of ``split``, found through Lightning's public API, in this order:

    1. ``trainer.datamodule.<split>_dataloader()``;
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
    if datamodule is not None and hasattr(datamodule, f"{split}_dataloader"):
        try:
            loader = _first(getattr(datamodule, f"{split}_dataloader")())
        except (*MISCONFIGURATION_ERRORS, ValueError):
            loader = None
    if loader is None:
        loader = _trainer_loader(trainer, split)
    module = trainer.lightning_module
    if loader is None and module is not None and is_overridden(f"{split}_dataloader", module):
        loader = _first(getattr(module, f"{split}_dataloader")())
    if loader is None and trainer.state.fn == "fit" and split in ("train", "val"):
        loop = trainer.fit_loop if split == "train" else trainer.fit_loop.epoch_loop.val_loop
        with preserved_rng_state():
            loop.setup_data()
        loader = _trainer_loader(trainer, split)
    if loader is None:
        unloaded = (" (with limit_val_batches=0 Lightning never loads the val_dataloaders given to fit)"
                    if split == "val" and trainer.limit_val_batches == 0 else "")
        raise MisconfigurationException(
            f"{owner} found no {split!r} dataloader to audit{unloaded}; pass a datamodule with "
            f"{split}_dataloader() or set dataloader= to a split the trainer has.")
    return loader


def draw_subset(dataset: Any, num_samples: Optional[int], seed: int, owner: str = "audit",
                split: str = "val") -> List[int]:
    """``num_samples`` dataset indices (all when ``None``) drawn with a generator seeded by ``seed``, sorted.

    Example:
        >>> draw_subset(list(range(10)), 4, seed=0)
        [1, 4, 5, 7]
    """
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise MisconfigurationException(
            f"{owner} needs a map-style dataset (with __len__ and __getitem__) for its fixed "
            f"audit subset; the {split!r} dataloader has {type(dataset).__name__}.")
    size = len(dataset)
    count = size if num_samples is None else min(num_samples, size)
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(size, generator=generator)[:count].tolist())


def build_batches(loader: Any, indices: Sequence[int], positions: Sequence[int], batch_size: Optional[int],
                  token_budget: int = AUDIT_TOKEN_BUDGET, owner: str = "audit",
                  split: str = "val") -> List[AuditBatch]:
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
    with torch.inference_mode(False):  # tensors built in validate/test must not be inference tensors
        groups = [positions[start:start + size] for start in range(0, len(positions), size)]
        if batch_size is None:
            groups = merge_small_batches(groups, indices, loader, token_budget)
        return [(pos, [indices[p] for p in pos], collate([loader.dataset[indices[p]] for p in pos]))
                for pos in groups]


def merge_small_batches(groups: List[List[int]], indices: Sequence[int], loader: Any,
                        token_budget: int = AUDIT_TOKEN_BUDGET) -> List[List[int]]:
    """Join consecutive loader-sized groups while the padded batch stays within ``token_budget`` tokens.

    Fewer, larger passes make the audit faster (per-pass overhead dominates small batches of short texts)
    while long documents keep the loader's batch size, so memory stays bounded.

    Example:
        >>> from torch.utils.data import DataLoader
        >>> collate = lambda rows: {"input_ids": torch.stack(rows)}
        >>> loader = DataLoader([torch.ones(4)] * 6, collate_fn=collate)
        >>> merge_small_batches([[0, 1], [2, 3], [4, 5]], range(6), loader, token_budget=16)
        [[0, 1, 2, 3], [4, 5]]
    """
    def width(pos: List[int]) -> int:
        batch = loader.collate_fn([loader.dataset[indices[p]] for p in pos])
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

"""Under DDP each process audits its shard of the subset; these gather the shards so every process holds all."""
from __future__ import annotations

from typing import Any, Dict, List

import pytorch_lightning as pl
import torch

from lightning_xai.callbacks.results import AuditExample

__all__ = ["gather_examples", "merge_extras"]


def _all_gather(trainer: "pl.Trainer", items: List[Any]) -> List[Any]:
    if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: List[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, items)
        return [item for part in gathered for item in part]
    return list(items)


def gather_examples(trainer: "pl.Trainer", examples: List[AuditExample]) -> List[AuditExample]:
    """Every process's examples, in audit-subset order (one process: just sorted).

    Example:
        >>> class Single:
        ...     world_size = 1
        >>> e = [AuditExample(p, p, "val", [], None, 0, 1.0) for p in (2, 0, 1)]
        >>> [x.position for x in gather_examples(Single(), e)]
        [0, 1, 2]
    """
    return sorted(_all_gather(trainer, examples), key=lambda e: e.position)


def merge_extras(trainer: "pl.Trainer", extras: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Combine the per-batch ``extra`` dicts of ``audit_batch`` (lists are concatenated, across ranks too).

    Example:
        >>> class Single:
        ...     world_size = 1
        >>> merge_extras(Single(), [{"a": [1, 2]}, {"a": 3, "b": [4]}])
        {'a': [1, 2, 3], 'b': [4]}
    """
    merged: Dict[str, Any] = {}
    for extra in _all_gather(trainer, extras):
        for key, value in extra.items():
            merged.setdefault(key, []).extend(value if isinstance(value, list) else [value])
    return merged

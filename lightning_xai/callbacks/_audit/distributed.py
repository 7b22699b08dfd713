"""Under DDP each process audits its shard of the subset; these gather the shards so every process holds all."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

import pytorch_lightning as pl
import torch

from lightning_xai.callbacks._audit.results import AuditExample

__all__ = ["AuditFailedOnAnotherProcess", "gather_examples", "merge_extras", "shared_failure"]


class AuditFailedOnAnotherProcess(RuntimeError):
    """Raised on the processes whose part of an audit succeeded when another process's part failed."""


def _distributed(trainer: "pl.Trainer") -> bool:
    return trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()


def _all_gather(trainer: "pl.Trainer", items: List[Any]) -> List[Any]:
    if _distributed(trainer):
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


@contextmanager
def shared_failure(trainer: "pl.Trainer") -> Iterator[None]:
    """Agree between processes on whether the block inside failed: if it raised on any process, it raises on all.

    Under DDP each process audits its shard; one that fails alone (e.g. out of memory on its GPU) would leave the
    others waiting in the audit's gather. On exit every process shares ``None`` or its exception's
    ``"Type: message"`` (one ``all_gather_object``); a failed process re-raises its own exception, the others
    raise :class:`AuditFailedOnAnotherProcess` naming the process and its error — so the audit is skipped (or,
    ``strict``, raised) on every process alike. One process: the block's exception, unchanged.

    Example:
        >>> class Single:
        ...     world_size = 1
        >>> with shared_failure(Single()):
        ...     pass
        >>> with shared_failure(Single()):
        ...     raise ValueError("bad")
        Traceback (most recent call last):
        ...
        ValueError: bad
    """
    error: Optional[BaseException] = None
    try:
        yield
    except Exception as err:  # noqa: BLE001 - shared below, then re-raised
        error = err
    if _distributed(trainer):
        shared: List[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(shared, None if error is None else f"{type(error).__name__}: {error}")
        failed = [(rank, text) for rank, text in enumerate(shared) if text is not None]
        if error is None and failed:
            rank, text = failed[0]
            raise AuditFailedOnAnotherProcess(f"the audit failed on process {rank} ({text}); skipped on every "
                                              "process so that none waits for the others")
    if error is not None:
        raise error

"""Under DDP each process audits its shard of the subset; these gather the shards so every process holds all, and
make every process take the same path when a step of an audit fails on some of them.

A model sharded with FSDP2 (:func:`replicated`) is the exception: each of its forward passes is itself a collective
(an all-gather per sharded layer), so processes that ran different numbers of passes would wait on each other
forever -- and the number of an audit's passes depends on its examples (leave-one-out chunks, erasure steps,
packing groups, permutations). There every process audits the *whole* subset, in the same batches: the same
examples and the same gathered parameters, under the same seeded generators, give every process the same sequence
of passes, whatever the examples; where a number of passes depends on computed values (a decision flip, a
convergence test, non-finite logits), every process takes process 0's decision
(:func:`~lightning_xai.adapters.sharding.lockstep`), so a last-bit difference between two processes' kernels cannot
part them either. Process 0 alone keeps what it found (the others contribute nothing to the gathers below), so the
results are those of one process.

The rule every audit step follows: local work (no collectives) runs inside :func:`shared_failure` (or
:func:`agreed`), whose exit is one collective that tells every process whether the work failed anywhere; only then
comes the next collective (a gather, a broadcast, a metric sync). So a failure on one process — out of memory on
its GPU, a logger that raises on process 0 only — is raised on every process at the same point, and the audit is
skipped (or, ``strict``, raised) on all of them instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import pickle
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.adapters.sharding import is_sharded
from lightning_xai.attribution.registry import ATTRIBUTION_METHODS
from lightning_xai.callbacks._audit.results import AuditExample

__all__ = [
    "AuditFailedOnAnotherProcess",
    "MisconfiguredOnAnotherProcess",
    "agreed",
    "gather_examples",
    "merge_extras",
    "refuse_unshardable",
    "replicated",
    "shared_failure",
]

T = TypeVar("T")


class AuditFailedOnAnotherProcess(RuntimeError):
    """Raised on the processes whose part of an audit succeeded when another process's part failed."""


class MisconfiguredOnAnotherProcess(AuditFailedOnAnotherProcess, MisconfigurationException):
    """Raised on the other processes when a :class:`MisconfigurationException` (e.g. the pre-fit probe's) was raised
    on one: the same class to catch, and the same message, on every process."""


def _distributed(trainer: "pl.Trainer") -> bool:
    return trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()


def replicated(trainer: "pl.Trainer") -> bool:
    """Whether every process audits the whole subset: several processes and a model sharded with FSDP2, whose
    passes are collectives (module docstring).

    Example:
        >>> class Single:
        ...     world_size = 1
        >>> replicated(Single())
        False
    """
    module = getattr(trainer, "lightning_module", None)
    return _distributed(trainer) and isinstance(module, torch.nn.Module) and is_sharded(module)


def refuse_unshardable(owner: str, methods: Sequence[Any], trainer: Any, module: Any) -> None:
    """Raise a :class:`MisconfigurationException` when ``module`` is sharded with FSDP2 and one of ``methods`` (names of
    registered attribution methods; others are ignored) cannot explain a sharded model (its record's
    ``unshardable``), naming the strategy and the methods that can.

    Example:
        >>> import torch
        >>> refuse_unshardable("AttentionAudit", ["alti"], None, torch.nn.Linear(2, 2))  # not sharded: nothing
    """
    if not isinstance(module, torch.nn.Module) or not is_sharded(module):
        return
    refused = [
        (m, ATTRIBUTION_METHODS[m].unshardable)
        for m in methods
        if isinstance(m, str) and m in ATTRIBUTION_METHODS and ATTRIBUTION_METHODS[m].unshardable
    ]
    if not refused:
        return
    strategy = type(getattr(trainer, "strategy", None)).__name__ if trainer is not None else "this strategy"
    able = sorted(name for name, record in ATTRIBUTION_METHODS.items() if not record.unshardable)
    reasons = "; ".join(f"{name!r}: {why}" for name, why in refused)
    raise MisconfigurationException(
        f"{owner}: the model is sharded with FSDP2 (fully_shard, under {strategy}), which "
        f"{', '.join(repr(m) for m, _ in refused)} cannot explain ({reasons}). Leave it out; the methods that explain "
        f"a sharded model are {', '.join(able)}. Or audit an unsharded copy (trainer.validate with the "
        "DDP strategy on the saved checkpoint)."
    )


def _all_gather(trainer: "pl.Trainer", items: List[Any]) -> List[Any]:
    if _distributed(trainer):
        with shared_failure(trainer):  # pickled first: a process that cannot must not leave the others in the gather
            payload = pickle.dumps(items)
        gathered: List[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, payload)
        return [item for part in gathered for item in pickle.loads(part)]
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


def _failures(trainer: "pl.Trainer", error: Optional[BaseException]) -> List[Tuple[int, str, str, bool]]:
    """Every failed process's ``(rank, type name, message, is a MisconfigurationException)``: one
    ``all_gather_object``, so every process must call it."""
    mine = None if error is None else (type(error).__name__, str(error), isinstance(error, MisconfigurationException))
    shared: List[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(shared, mine)
    return [(rank, *found) for rank, found in enumerate(shared) if found is not None]


def _raised_elsewhere(rank: int, kind: str, message: str, misconfigured: bool) -> AuditFailedOnAnotherProcess:
    if misconfigured:  # the same clear message on every process (the probe's configuration errors always raise)
        return MisconfiguredOnAnotherProcess(
            f"{message} (found on process {rank}; raised on every process so that none waits for the others)"
        )
    return AuditFailedOnAnotherProcess(
        f"the audit failed on process {rank} ({kind}: {message}); skipped on every "
        "process so that none waits for the others"
    )


@contextmanager
def shared_failure(trainer: "pl.Trainer") -> Iterator[None]:
    """Agree between processes on whether the block inside failed: if it raised on any process, it raises on all.

    Under DDP each process audits its shard; one that fails alone (e.g. out of memory on its GPU) would leave the
    others waiting in the audit's next collective. On exit every process shares ``None`` or its exception's
    ``"Type: message"`` (one ``all_gather_object``, reached by every process whatever the block did); a failed
    process re-raises its own exception, the others raise :class:`AuditFailedOnAnotherProcess` naming the process
    and its error (:class:`MisconfiguredOnAnotherProcess`, with the same message, for a
    :class:`MisconfigurationException`) — so the audit is skipped (or, ``strict``, raised) on every process alike.
    The block must make no collective itself. One process: the block's exception, unchanged.

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
        failed = _failures(trainer, error)
        if error is None and failed:
            raise _raised_elsewhere(*failed[0])
    if error is not None:
        raise error


def agreed(trainer: "pl.Trainer", step: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``step(*args, **kwargs)`` — local work, no collectives — under :func:`shared_failure`: its result, or on
    every process an exception when it raised on any.

    Example:
        >>> class Single:
        ...     world_size = 1
        >>> agreed(Single(), max, 2, 3)
        3
    """
    with shared_failure(trainer):
        result = step(*args, **kwargs)
    return result

"""When an audit runs and on how many examples: the sums behind the trigger methods of
:class:`~lightning_xai.callbacks.AuditCallback`, as functions of what they read (the callback and its
:class:`~lightning_xai.callbacks._audit.budget.AuditBudget` keep the state)."""
from __future__ import annotations

import time
from typing import Any, Iterable, List, Optional, Tuple

from lightning_xai.callbacks._audit.budget import AuditBudget, AuditCost, limited_size

__all__ = ["audit_clocks", "audit_costs", "clock_mark", "subset_size", "training_since"]


def subset_size(size: Optional[int], trainer: Any, split: str, loader: Any) -> Optional[int]:
    """The audit subset size ``size`` (the budget's plan, else ``num_samples``) capped by the trainer's
    ``limit_<split>_batches`` (:func:`~lightning_xai.callbacks._audit.budget.limited_size`; ``fast_dev_run`` sets
    them to its batch count).

    Example:
        >>> from types import SimpleNamespace
        >>> subset_size(256, SimpleNamespace(limit_val_batches=2), "val", SimpleNamespace(dataset=range(872),
        ...                                                                                batch_size=32))
        64
    """
    limit = getattr(trainer, f"limit_{split}_batches", None)
    try:
        total: Optional[int] = len(loader.dataset)
    except TypeError:
        total = None
    return limited_size(size, limit, getattr(loader, "batch_size", None) or 1, total)


def audit_costs(callbacks: Iterable[Any]) -> List[AuditCost]:
    """The cost clocks of every audit callback among ``callbacks`` (the ``cost`` of their ``_budget``).

    Example:
        >>> from types import SimpleNamespace
        >>> budget = AuditBudget(0.05)
        >>> audit_costs([SimpleNamespace(_budget=budget), object()]) == [budget.cost]
        True
    """
    budgets = (getattr(c, "_budget", None) for c in callbacks)
    return [budget.cost for budget in budgets if isinstance(budget, AuditBudget)]


def audit_clocks(callbacks: Iterable[Any]) -> float:
    """Seconds spent so far in the audits of every audit callback among ``callbacks`` (:func:`audit_costs`).

    Example:
        >>> from types import SimpleNamespace
        >>> budget = AuditBudget(0.05)
        >>> budget.cost.audited(2.0)
        >>> audit_clocks([SimpleNamespace(_budget=budget), object()])
        2.0
    """
    return sum(cost.total for cost in audit_costs(callbacks))


def training_since(mark: Optional[Tuple[float, float]], now: float, clocks: float) -> float:
    """Training seconds since ``mark`` = ``(time, audit clocks then)``: the wall time minus every audit's time
    in between (``clocks``: the audit clocks now); 0 without a mark.

    Example:
        >>> training_since((100.0, 3.0), now=150.0, clocks=8.0)
        45.0
    """
    if mark is None:
        return 0.0
    started, audits = mark
    return now - started - (clocks - audits)


def clock_mark(callbacks: Iterable[Any]) -> Tuple[float, float]:
    """``(now, audit clocks now)``: the mark :func:`training_since` counts from."""
    return time.perf_counter(), audit_clocks(callbacks)

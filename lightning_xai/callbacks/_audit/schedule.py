"""When an audit runs and on how many examples: the sums behind the trigger methods of
:class:`~lightning_xai.callbacks.AuditCallback`, as functions of what they read, and :class:`AuditSchedule`, the
callback's record of what it audited and how a scheduled audit runs (isolated, clocked, budgeted)."""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar

import pytorch_lightning as pl
from pytorch_lightning.utilities.rank_zero import rank_zero_info

from lightning_xai.callbacks._audit.budget import AuditBudget, limited_size
from lightning_xai.callbacks._audit.cost import AuditCost
from lightning_xai.callbacks._audit.distributed import agreed
from lightning_xai.callbacks._audit.failures import AuditFailures
from lightning_xai.callbacks._audit.subset import AuditSubsets

__all__ = [
    "AuditSchedule",
    "trainer_callbacks",
    "audit_clocks",
    "audit_costs",
    "clock_mark",
    "subset_size",
    "training_since",
]

T = TypeVar("T")
#: a callback's logging step: ``log(stage, scalars)``
Log = Callable[[str, Dict[str, float]], None]


def trainer_callbacks(trainer: "pl.Trainer") -> List[pl.Callback]:
    """``trainer.callbacks``: Lightning's CallbackConnector sets it; the Trainer class does not declare it."""
    return trainer.callbacks  # type: ignore[attr-defined]


class AuditSchedule:
    """Which scheduled audits of ``fit`` are due, and how one runs: each optimizer step and each epoch is audited
    at most once (an epoch's validation end and its train epoch end both ask), at the cadence of the callback's
    :class:`~lightning_xai.callbacks._audit.budget.AuditBudget`; a scheduled audit runs isolated (a failure is
    reported by the callback's :class:`~lightning_xai.callbacks._audit.failures.AuditFailures`), clocked and
    budgeted. The callback owns the budget, its subsets and its failures and hands them to its schedule.

    Example:
        >>> from lightning_xai.callbacks._audit.subset import AuditSubsets
        >>> schedule = AuditSchedule("AttentionAudit", AuditBudget(None), AuditSubsets("AttentionAudit"),
        ...                          AuditFailures("AttentionAudit", strict=False))
        >>> [step for step in (0, 2, 2, 3, 4) if schedule.step_due(step, every_n_train_steps=2)]
        [2, 4]
        >>> [epoch for epoch in (0, 0, 1, 2) if schedule.epoch_due(epoch, every_n_epochs=2)]
        [1]
    """

    def __init__(self, owner: str, budget: AuditBudget, subsets: AuditSubsets, failures: AuditFailures) -> None:
        self.owner, self.budget, self.subsets, self.failures = owner, budget, subsets, failures
        self.last_step: Optional[int] = None
        self.last_epoch: Optional[int] = None

    def reset(self) -> None:
        """A new Trainer: its epochs and steps count from 0 again."""
        self.last_step = self.last_epoch = None

    def step_due(self, step: int, every_n_train_steps: Optional[int]) -> bool:
        """Whether optimizer step ``step`` is audited: every ``every_n_train_steps``-th, once."""
        n = every_n_train_steps
        due = n is not None and n > 0 and step > 0 and step % n == 0 and step != self.last_step
        if due:
            self.last_step = step
        return due

    def epoch_due(self, epoch: int, every_n_epochs: int) -> bool:
        """Whether the end of ``epoch`` is audited: the budget's cadence of ``every_n_epochs``, once."""
        due = self.budget.epoch_due(epoch, every_n_epochs) and epoch != self.last_epoch
        if due:
            self.last_epoch = epoch
        return due

    def run(
        self,
        trainer: "pl.Trainer",
        stage: str,
        split: str,
        audit: Callable[[], T],
        log: Log,
        limited: Callable[[], bool],
        *,
        min_seconds: float,
        cadence: Tuple[int, Optional[int]],
    ) -> Optional[T]:
        """``audit()``, isolated and clocked: its result, or ``None`` when it failed (reported; ``strict``
        re-raises). Logs ``cost/seconds`` (``log(stage, scalars)``); the first audit of ``fit`` sets the budget's
        plan (:meth:`~lightning_xai.callbacks._audit.budget.AuditBudget.after_first_audit`; ``limited``,
        ``min_seconds``, ``cadence`` = ``(every_n_epochs, every_n_train_steps)``). Every step agrees across
        processes (:func:`~lightning_xai.callbacks._audit.distributed.shared_failure`): all report, or all raise."""
        start = time.perf_counter()
        training = (
            training_since(self.budget.mark, start, audit_clocks(trainer_callbacks(trainer))) if stage == "fit" else 0.0
        )
        try:
            result = audit()
            seconds = time.perf_counter() - start
            self.budget.cost.audited(seconds)
            agreed(trainer, log, stage, {"cost/seconds": seconds})
            if stage == "fit":
                self.budget.after_first_audit(
                    trainer,
                    self.owner,
                    self.subsets,
                    split,
                    seconds,
                    training,
                    limited,
                    partial(log, "fit"),
                    min_seconds=min_seconds,
                    every_n_epochs=cadence[0],
                    every_n_train_steps=cadence[1],
                )
        except Exception as err:  # noqa: BLE001 - any failure of an audit is reported, training goes on
            self.failures.report(err, stage, split, trainer.current_epoch, trainer.global_step)
            return None
        if stage == "fit":
            self.budget.mark = clock_mark(trainer_callbacks(trainer))
        if stage != "fit" and (line := self.budget.cost.first_announcement(self.owner)):
            rank_zero_info(line)
        return result

    def epoch_ended(self, trainer: "pl.Trainer", log: Log, split: str) -> None:
        """A training epoch ended: the budget logs its audits' share of it
        (:meth:`~lightning_xai.callbacks._audit.budget.AuditBudget.epoch_ended`)."""
        self.budget.epoch_ended(
            trainer, self.owner, audit_costs(trainer_callbacks(trainer)), partial(log, "fit"), self.failures, split
        )


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

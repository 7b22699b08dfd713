"""What an audit costs and what it may cost: its measured time, and the subset size and cadence that keep it
within a share of the training time.

:class:`~lightning_xai.callbacks._audit.cost.AuditCost` clocks the audits of one callback and the training epochs they
run in. :func:`plan` is pure
arithmetic, no Lightning: it takes what the first audit measured (seconds per audited example, training seconds
since the previous audit) and returns a :class:`Plan`. :class:`AuditBudget` is the state a callback keeps of them
(its clock, its plan, the cadence and subset size that follow): the callbacks
(:class:`~lightning_xai.callbacks.AuditCallback`, ``budget=``) own one and plan once, after their first audit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Union

import pytorch_lightning as pl
from pytorch_lightning.utilities.rank_zero import rank_zero_info

from lightning_xai.callbacks._audit.cost import AuditCost
from lightning_xai.callbacks._audit.distributed import agreed, shared_failure
from lightning_xai.callbacks._audit.failures import AuditFailures
from lightning_xai.callbacks._audit.subset import AuditSubsets

__all__ = [
    "AuditBudget",
    "DEFAULT_EVERY_N_EPOCHS",
    "DEFAULT_NUM_SAMPLES",
    "Default",
    "MAX_CADENCE",
    "MIN_AUDIT_SECONDS",
    "MIN_SAMPLES",
    "Plan",
    "describe",
    "limited_size",
    "plan",
]

#: the budget never shrinks the audit subset below this many examples (an explicit ``num_samples`` may)
MIN_SAMPLES = 128
#: the budget audits at least every ``MAX_CADENCE``-th time the user's cadence would (epochs or steps)
MAX_CADENCE = 10
#: an audit that took less than this many seconds is never thinned: it cannot cost much in absolute terms, and on
#: short runs (tests, tutorials on small slices) timing noise would make the cadence arbitrary
MIN_AUDIT_SECONDS = 5.0


class Default(int):
    """An int default the user did not pass, so a budget may change it (``Default(256) == 256``, but a user's
    literal ``256`` is a plain ``int``: an explicit choice, which the budget keeps).

    Example:
        >>> isinstance(DEFAULT_NUM_SAMPLES, Default), DEFAULT_NUM_SAMPLES == 256, isinstance(256, Default)
        (True, True, False)
    """


def _represent_default(dumper: Any, value: Default) -> Any:
    return dumper.represent_int(int(value))


try:  # configuration files (LightningCLI's saved config.yaml) write a Default as the int it is
    import yaml

    for _dumper in (yaml.Dumper, yaml.SafeDumper):
        _dumper.add_representer(Default, _represent_default)
except ImportError:  # pragma: no cover - PyYAML comes with Lightning
    pass

#: ``num_samples`` of the audit callbacks when not given (the budget may shrink it, never below ``MIN_SAMPLES``)
DEFAULT_NUM_SAMPLES = Default(256)
#: ``every_n_epochs`` of the audit callbacks when not given (the budget may raise it up to ``MAX_CADENCE``)
DEFAULT_EVERY_N_EPOCHS = Default(1)


def limited_size(
    size: Optional[int], limit: Union[int, float, None], batch_size: int, total: Optional[int]
) -> Optional[int]:
    """The audit subset size under Lightning's ``limit_<split>_batches`` (which ``fast_dev_run`` sets to 1).

    An int ``N`` audits at most the ``N * batch_size`` examples Lightning itself would read; a fraction ``f``
    audits ``ceil(f * size)`` (``size=None``: the split's ``total``); ``None``, ``1.0`` and ``0`` (validation
    switched off, not the audit) leave ``size`` as it is.

    Example:
        >>> limited_size(256, 1, 32, 872), limited_size(256, 0.25, 32, 872), limited_size(None, 1.0, 32, 872)
        (32, 64, None)
    """
    if limit is None or isinstance(limit, bool) or limit == 0 or (isinstance(limit, float) and limit >= 1.0):
        return size
    if isinstance(limit, float):
        base = size if size is not None else total
        return None if base is None else max(1, math.ceil(limit * base))
    cap = int(limit) * max(1, batch_size)
    return cap if size is None else min(size, cap)


@dataclass(frozen=True)
class Plan:
    """The sizing chosen for a budget.

    Attributes:
        num_samples: size of the fixed audit subset.
        cadence: audit every ``cadence``-th time the configured cadence would (1: as configured).
        share: predicted audit time / training time at this size and cadence.
        fits: whether ``share <= budget`` (``False``: even the smallest subset at the largest cadence, or what
            the user fixed, exceeds it).
    """

    num_samples: int
    cadence: int
    share: float
    fits: bool


def plan(
    seconds_per_example: float,
    train_seconds: float,
    budget: float,
    requested_samples: int,
    min_samples: int = MIN_SAMPLES,
    max_cadence: int = MAX_CADENCE,
    *,
    fixed_samples: bool = False,
    fixed_cadence: bool = False,
) -> Plan:
    """Size an audit to ``budget`` = audit time / training time between audits.

    The audit of ``n`` examples at cadence ``k`` costs ``n * seconds_per_example`` every ``k * train_seconds``
    of training. The cadence is lowered first: the smallest ``k <= max_cadence`` at which ``requested_samples``
    fit. Only if none does, the subset shrinks at ``k = max_cadence`` to what fits, never below
    ``min(min_samples, requested_samples)`` and never above ``requested_samples``. ``fixed_samples`` /
    ``fixed_cadence`` (the user chose them) keep ``requested_samples`` / ``k = 1``.

    Args:
        seconds_per_example: measured audit seconds per audited example (> 0).
        train_seconds: training seconds between two audits at the configured cadence (> 0).
        budget: the allowed share (> 0).
        requested_samples: the subset size the audit would use without a budget.
        min_samples: the smallest subset the budget may choose.
        max_cadence: the largest cadence multiplier the budget may choose.
        fixed_samples / fixed_cadence: keep the subset size / the cadence as configured.

    Example:
        >>> plan(0.01, 100.0, 0.05, 256)                 # 2.56 s per 100 s: fits as configured
        Plan(num_samples=256, cadence=1, share=0.0256, fits=True)
        >>> plan(0.05, 100.0, 0.05, 256)                 # 12.8 s per 100 s: audit every 3rd epoch
        Plan(num_samples=256, cadence=3, share=0.04266666666666667, fits=True)
        >>> plan(1.0, 100.0, 0.05, 256)                  # too slow even every 10th epoch: 128 is the floor
        Plan(num_samples=128, cadence=10, share=0.128, fits=False)
    """
    if not seconds_per_example > 0 or not math.isfinite(seconds_per_example):
        raise ValueError(f"seconds_per_example must be a positive finite number, got {seconds_per_example!r}")
    if not train_seconds > 0 or not math.isfinite(train_seconds):
        raise ValueError(f"train_seconds must be a positive finite number, got {train_seconds!r}")
    if not budget > 0:
        raise ValueError(f"budget must be > 0, got {budget!r}")
    if requested_samples < 1 or min_samples < 1 or max_cadence < 1:
        raise ValueError("requested_samples, min_samples and max_cadence must be >= 1")

    def share(n: int, k: int) -> float:
        return n * seconds_per_example / (k * train_seconds)

    def done(n: int, k: int) -> Plan:
        value = share(n, k)
        return Plan(num_samples=n, cadence=k, share=value, fits=value <= budget)

    largest = 1 if fixed_cadence else max_cadence
    needed = math.ceil(share(requested_samples, 1) / budget * (1 - 1e-12))
    if needed <= largest:
        return done(requested_samples, max(1, needed))
    if fixed_samples:
        return done(requested_samples, largest)
    fitting = math.floor(budget * largest * train_seconds / seconds_per_example)
    floor = min(min_samples, requested_samples)
    return done(min(requested_samples, max(floor, fitting)), largest)


def describe(
    owner: str, chosen: Plan, budget: float, measured: float, cadence_unit: str, configured: Optional[int]
) -> str:
    """The one line a callback prints about its plan.

    Example:
        >>> print(describe("AttentionAudit", Plan(256, 3, 0.043, True), 0.05, 0.128, "epochs", 1))
        AttentionAudit: budget 5% of training time; the first audit took 12.8% -> auditing 256 examples every 3 epochs (predicted 4.3%).
    """
    every = (configured or 1) * chosen.cadence
    text = (
        f"{owner}: budget {100 * budget:.0f}% of training time; the first audit took {100 * measured:.1f}% -> "
        f"auditing {chosen.num_samples} examples every {every} {cadence_unit} "
        f"(predicted {100 * chosen.share:.1f}%)"
    )
    if not chosen.fits:
        text += (
            "; this still exceeds the budget: pass a smaller num_samples=, fewer methods, or budget=None to "
            "accept the cost"
        )
    return text + "."


class AuditBudget:
    """The cost budget of one audit callback: its cost clock, the plan it chose, and the cadence and subset size
    that follow from the plan (checkpointed with the callback).

    **What the callback's ``budget=`` does** (``0.05``; ``None``: off): after the first audit of ``fit`` the
    callback audits every ``k``-th epoch (``k <= 10``), and only if that is not enough fewer examples (never below
    128, the first ``N`` of the same draw), to spend at most ``budget`` of the training time; what the user passed
    (``num_samples``, the cadence) and audits under ``budget_min_seconds`` (5 s) are kept. The plan is logged
    (``<prefix>/budget/...``), printed and checkpointed; each epoch's share is logged as ``<prefix>/cost/share``.

    The callback owns one and calls it from its Lightning hooks. The local steps (:meth:`choose`: :func:`plan`;
    :meth:`adopt`) make no collective; the two trainer steps do, reached by every process in the same order:
    :meth:`after_first_audit` broadcasts process 0's plan (every process audits the same subset at the same
    cadence) and :meth:`epoch_ended` logs under :func:`~lightning_xai.callbacks._audit.distributed.agreed`, each
    local step inside :func:`~lightning_xai.callbacks._audit.distributed.shared_failure`, so a failure on one
    process raises on all and none is left waiting.

    Args:
        share: the share of training time the audits may take (``None``: no budget; ``cost`` still clocks them).
        num_samples / every_n_epochs / every_n_train_steps: as the callback was given them. A :class:`Default` (not
            passed) may be changed by the budget; what the user passed is kept, and a step cadence keeps the cadence.

    Attributes:
        cost: the :class:`AuditCost` clock of the callback's audits.
        plan: the :class:`Plan` chosen (``None``: none yet, or no budget).
        cadence / cadence_offset: audit every ``cadence``-th configured epoch, counted from ``cadence_offset``.
        planned_samples: the subset size of the plan when it changed it (``None``: ``num_samples``).
        mark: ``(time, audit clocks then)`` that training time is counted from (``None``: not started).

    Example:
        >>> budget = AuditBudget(0.05, num_samples=DEFAULT_NUM_SAMPLES, every_n_epochs=DEFAULT_EVERY_N_EPOCHS)
        >>> budget.wanted(audited=256, training=100.0)
        True
        >>> chosen = budget.choose(seconds=12.8, training=100.0, audited=256)
        >>> budget.adopt(chosen, audited=256, epoch=0)   # every 3rd epoch from epoch 1; the subset is kept
        False
        >>> [epoch for epoch in range(1, 10) if budget.epoch_due(epoch, every_n_epochs=1)]
        [3, 6, 9]
        >>> budget.state_dict()
        {'plan': {'num_samples': 256, 'cadence': 3, 'share': 0.04266666666666667, 'fits': True}, 'cadence_offset': 1}
    """

    def __init__(
        self,
        share: Optional[float],
        *,
        num_samples: Optional[int] = None,
        every_n_epochs: Optional[int] = None,
        every_n_train_steps: Optional[int] = None,
    ) -> None:
        self.share = None if share is None else float(share)
        # a default the user did not pass (a Default) may be changed by the budget; the user's own is kept
        self.fixed_samples = not isinstance(num_samples, Default)
        self.fixed_cadence = not isinstance(every_n_epochs or 0, Default) or bool(every_n_train_steps)
        self.cost = AuditCost()
        self.plan: Optional[Plan] = None
        self.cadence, self.cadence_offset = 1, 0
        self.planned_samples: Optional[int] = None
        self.mark: Optional[Tuple[float, float]] = None

    def wanted(self, audited: int, training: float) -> bool:
        """Whether to plan now: a budget, no plan yet, and an audit of ``audited`` examples after ``training`` s."""
        return self.share is not None and self.plan is None and audited > 0 and training > 0

    def choose(
        self,
        seconds: float,
        training: float,
        audited: int,
        *,
        limited: bool = False,
        min_seconds: float = MIN_AUDIT_SECONDS,
    ) -> Plan:
        """The plan for an audit of ``audited`` examples that took ``seconds`` after ``training`` seconds of
        training. ``limited`` (the trainer capped the subset) keeps its size; an audit under ``min_seconds`` keeps
        its size and cadence."""
        if self.share is None:
            raise ValueError("no budget to plan for (budget=None)")
        cheap = seconds < min_seconds
        return plan(
            seconds / audited,
            training,
            self.share,
            audited,
            fixed_samples=self.fixed_samples or limited or cheap,
            fixed_cadence=self.fixed_cadence or cheap,
        )

    def adopt(self, chosen: Plan, audited: int, epoch: int) -> bool:
        """Take the plan every process received after the audit of ``epoch`` on ``audited`` examples; ``True``
        when it shrinks the subset (to the first ``num_samples`` of the same seeded draw: a subset of the first)."""
        self.plan = chosen
        if chosen.cadence > 1:  # the next audit comes every_n_epochs * cadence epochs after this one
            self.cadence, self.cadence_offset = chosen.cadence, epoch + 1
        if chosen.num_samples < audited:
            self.planned_samples = chosen.num_samples
            return True
        return False

    def after_first_audit(
        self,
        trainer: "pl.Trainer",
        owner: str,
        subsets: AuditSubsets,
        split: str,
        seconds: float,
        training: float,
        limited: Callable[[], bool],
        log: Callable[[Dict[str, float]], None],
        *,
        min_seconds: float,
        every_n_epochs: int,
        every_n_train_steps: Optional[int],
    ) -> None:
        """After the first audit of ``fit`` (``seconds`` long, ``training`` s after the previous mark): size the
        subset and cadence to the budget on process 0, take its plan on every process, log and print it.
        ``limited()``: whether the trainer caps the subset (its size is then kept)."""
        audited = subsets.audited(split)
        # Trainer.fast_dev_run is set by Lightning's debugging setup; the Trainer class does not declare it
        if not self.wanted(audited, training) or trainer.fast_dev_run:  # type: ignore[attr-defined]
            return
        with shared_failure(trainer):  # a failure on one process: every process raises, none waits in the broadcast
            chosen = self.choose(seconds, training, audited, limited=limited(), min_seconds=min_seconds)
        chosen = trainer.strategy.broadcast(chosen, src=0)  # every process audits the same subset, same cadence
        if self.adopt(chosen, audited, trainer.current_epoch):  # the first N of the same seeded draw
            subsets.forget(split)
        measured = seconds / training
        with shared_failure(trainer):  # logging the plan failed on one process: an audit failure on all
            log(self.scalars(measured, every_n_epochs))
            rank_zero_info(self.announcement(owner, measured, every_n_epochs, every_n_train_steps))

    def epoch_ended(
        self,
        trainer: "pl.Trainer",
        owner: str,
        others: Iterable[AuditCost],
        log: Callable[[Dict[str, float]], None],
        failures: AuditFailures,
        split: str,
    ) -> None:
        """At a training epoch's end: log the share of it this callback's audits took (``cost/share``; ``others``:
        every audit callback's clock) and print the first audit's cost once. A logger failing on one process is
        reported as a failed audit (``failures``) on every process alike."""
        spent = self.cost.epoch_ended(others)
        if spent is None:
            return
        audits, training = spent
        try:
            agreed(trainer, log, {"cost/share": audits / training if training > 0 else float("nan")})
        except Exception as err:  # noqa: BLE001 - as a failed audit
            failures.report(err, "fit", split, trainer.current_epoch, trainer.global_step)
            return
        if line := self.cost.first_announcement(owner, audits, training):
            rank_zero_info(line)

    def epoch_due(self, epoch: int, every_n_epochs: int) -> bool:
        """Whether the end of ``epoch`` is an audit's: every ``every_n_epochs * cadence``-th epoch from the plan's."""
        every = every_n_epochs * self.cadence
        return bool(every) and (epoch + 1 - self.cadence_offset) % every == 0

    def scalars(self, measured: float, every_n_epochs: int) -> Dict[str, float]:
        """The adopted plan's logged scalars (``measured``: the first audit's share of the training time)."""
        chosen = self._adopted()
        return {
            "budget/num_samples": float(chosen.num_samples),
            "budget/share": measured,
            "budget/every_n_epochs": float(every_n_epochs * chosen.cadence),
        }

    def announcement(self, owner: str, measured: float, every_n_epochs: int, every_n_train_steps: Optional[int]) -> str:
        """The line the callback prints about the adopted plan (:func:`describe`)."""
        unit = "epochs" if every_n_epochs else "scheduled steps"
        return describe(
            owner, self._adopted(), self.share or 0.0, measured, unit, every_n_epochs or every_n_train_steps
        )

    def _adopted(self) -> Plan:
        if self.plan is None:
            raise ValueError("no plan adopted yet (AuditBudget.adopt comes first)")
        return self.plan

    def state_dict(self) -> Dict[str, Any]:
        """The plan and where its cadence counts from: a resumed run audits the same subset at the same cadence."""
        return {"plan": None if self.plan is None else vars(self.plan).copy(), "cadence_offset": self.cadence_offset}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        """Restore :meth:`state_dict` (a checkpoint without a plan changes nothing)."""
        if state and state.get("plan"):
            self.plan = Plan(**state["plan"])
            self.cadence, self.cadence_offset = self.plan.cadence, int(state.get("cadence_offset", 0))
            self.planned_samples = self.plan.num_samples

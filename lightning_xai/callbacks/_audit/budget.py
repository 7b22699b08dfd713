"""What an audit costs and what it may cost: its measured time, and the subset size and cadence that keep it
within a share of the training time.

:class:`AuditCost` clocks the audits of one callback and the training epochs they run in. :func:`plan` is pure
arithmetic, no Lightning: it takes what the first audit measured (seconds per audited example, training seconds
since the previous audit) and returns a :class:`Plan`. The callbacks (:class:`~lightning_xai.callbacks.AuditCallback`,
``budget=``) call it once, after their first audit.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple, Union

__all__ = ["AuditCost", "DEFAULT_EVERY_N_EPOCHS", "DEFAULT_NUM_SAMPLES", "Default", "MAX_CADENCE",
           "MIN_AUDIT_SECONDS", "MIN_SAMPLES", "Plan", "describe", "limited_size", "plan"]

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


def limited_size(size: Optional[int], limit: Union[int, float, None], batch_size: int,
                 total: Optional[int]) -> Optional[int]:
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


def plan(seconds_per_example: float, train_seconds: float, budget: float, requested_samples: int,
         min_samples: int = MIN_SAMPLES, max_cadence: int = MAX_CADENCE, *, fixed_samples: bool = False,
         fixed_cadence: bool = False) -> Plan:
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


def describe(owner: str, chosen: Plan, budget: float, measured: float, cadence_unit: str,
             configured: Optional[int]) -> str:
    """The one line a callback prints about its plan.

    Example:
        >>> print(describe("AttentionAudit", Plan(256, 3, 0.043, True), 0.05, 0.128, "epochs", 1))
        AttentionAudit: budget 5% of training time; the first audit took 12.8% -> auditing 256 examples every 3 epochs (predicted 4.3%).
    """
    every = (configured or 1) * chosen.cadence
    text = (f"{owner}: budget {100 * budget:.0f}% of training time; the first audit took {100 * measured:.1f}% -> "
            f"auditing {chosen.num_samples} examples every {every} {cadence_unit} "
            f"(predicted {100 * chosen.share:.1f}%)")
    if not chosen.fits:
        text += ("; this still exceeds the budget: pass a smaller num_samples=, fewer methods, or budget=None to "
                 "accept the cost")
    return text + "."


class AuditCost:
    """Clock the audits of one callback and the training epochs they run in.

    The epoch's *training time* is its wall time from ``on_train_epoch_start`` to ``on_train_epoch_end``
    (training steps, data loading, validation, other callbacks) minus the time spent in the audits of every audit
    callback of the trainer (``others``), so that three audit callbacks do not count each other as training.

    Example:
        >>> cost = AuditCost()
        >>> cost.epoch_started(now=100.0)
        >>> cost.audited(2.0)
        >>> share = cost.epoch_ended(now=142.0)          # 42 s wall, 2 s of it this audit: 40 s of training
        >>> share
        (2.0, 40.0)
        >>> print(cost.announcement("AttentionAudit", *share))
        AttentionAudit: the first audit took 2.0 s, 5.0% of the training epoch it ran in (40.0 s without audits).
    """

    def __init__(self) -> None:
        self.first: Optional[float] = None
        self.announced = False
        self.epoch_audits: List[float] = []
        self.total = 0.0  # seconds of every audit so far (the budget subtracts other callbacks' audits)
        self._epoch_start: Optional[float] = None

    def epoch_started(self, now: Optional[float] = None) -> None:
        """A training epoch starts: its clock starts and its list of audit times empties."""
        self._epoch_start = time.perf_counter() if now is None else now
        self.epoch_audits = []

    def audited(self, seconds: float) -> None:
        """An audit of this callback took ``seconds``."""
        if self.first is None:
            self.first = seconds
        self.epoch_audits.append(seconds)
        self.total += seconds

    def epoch_ended(self, others: Iterable["AuditCost"] = (), now: Optional[float] = None
                    ) -> Optional[Tuple[float, float]]:
        """``(audit seconds, training seconds)`` of the epoch that ends, or ``None`` if this callback did not
        audit in it (or the epoch's start was not seen)."""
        if self._epoch_start is None or not self.epoch_audits:
            return None
        elapsed = (time.perf_counter() if now is None else now) - self._epoch_start
        audits = sum(self.epoch_audits)
        training = elapsed - audits - sum(sum(o.epoch_audits) for o in others if o is not self)
        return audits, max(training, 0.0)

    def announcement(self, owner: str, audits: Optional[float] = None, training: Optional[float] = None) -> str:
        """The one-line cost report of the first audit (against the epoch's training time when known)."""
        first = self.first or 0.0
        text = f"{owner}: the first audit took {first:.1f} s"
        if training is None or audits is None:
            return text + " (no training epoch to compare it with)."
        text += (f", {100 * first / training:.1f}% of the training epoch it ran in ({training:.1f} s without "
                 "audits)" if training > 0 else ", longer than the training epoch it ran in")
        count = len(self.epoch_audits)
        if count > 1:
            text += f"; that epoch's {count} audits took {audits:.1f} s"
            text += f" ({100 * audits / training:.1f}%)" if training > 0 else ""
        return text + "."

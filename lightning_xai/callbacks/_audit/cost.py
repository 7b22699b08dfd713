"""The clock of an audit callback's cost: how long its audits took, and the training time of the epochs they ran in
(other audit callbacks' audits not counted as training). :class:`~lightning_xai.callbacks._audit.budget.AuditBudget`
owns one and plans from it.
"""

from __future__ import annotations

import time
from typing import Iterable, List, Optional, Tuple

__all__ = ["AuditCost"]


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

    def epoch_ended(
        self, others: Iterable["AuditCost"] = (), now: Optional[float] = None
    ) -> Optional[Tuple[float, float]]:
        """``(audit seconds, training seconds)`` of the epoch that ends, or ``None`` if this callback did not
        audit in it (or the epoch's start was not seen)."""
        if self._epoch_start is None or not self.epoch_audits:
            return None
        elapsed = (time.perf_counter() if now is None else now) - self._epoch_start
        audits = sum(self.epoch_audits)
        training = elapsed - audits - sum(sum(o.epoch_audits) for o in others if o is not self)
        return audits, max(training, 0.0)

    def first_announcement(
        self, owner: str, audits: Optional[float] = None, training: Optional[float] = None
    ) -> Optional[str]:
        """:meth:`announcement` the first time it is asked for, then ``None`` (the callback prints it once)."""
        if self.announced:
            return None
        self.announced = True
        return self.announcement(owner, audits, training)

    def announcement(self, owner: str, audits: Optional[float] = None, training: Optional[float] = None) -> str:
        """The one-line cost report of the first audit (against the epoch's training time when known)."""
        first = self.first or 0.0
        text = f"{owner}: the first audit took {first:.1f} s"
        if training is None or audits is None:
            return text + " (no training epoch to compare it with)."
        text += (
            f", {100 * first / training:.1f}% of the training epoch it ran in ({training:.1f} s without audits)"
            if training > 0
            else ", longer than the training epoch it ran in"
        )
        count = len(self.epoch_audits)
        if count > 1:
            text += f"; that epoch's {count} audits took {audits:.1f} s"
            text += f" ({100 * audits / training:.1f}%)" if training > 0 else ""
        return text + "."

"""A failing audit is reported and skipped, never the end of training (unless the callback is ``strict``).

Under DDP a failure on some processes only (e.g. out of memory on one GPU) is shared before the audit's gather
(:func:`~lightning_xai.callbacks._audit.distributed.shared_failure`), so every process skips the audit (or raises).
"""
from __future__ import annotations

import traceback
from typing import Optional, Set

from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_debug, rank_zero_warn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = ["AuditFailures", "failure_fix"]


def failure_fix(err: BaseException) -> str:
    """What to try for an exception raised inside an audit.

    Example:
        >>> failure_fix(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))[:40]
        'the audit ran out of memory: lower the c'
    """
    text = str(err).lower()
    if "out of memory" in text or type(err).__name__ == "OutOfMemoryError":
        return ("the audit ran out of memory: lower the callback's batch_size= (by default consecutive batches are "
                "joined up to 8,192 tokens) or num_samples=")
    if isinstance(err, ProtocolError):
        return "the model (or its adapter) does not give what the audit reads: fix the adapter's arguments"
    if isinstance(err, MisconfigurationException):
        return "fix the configuration named above"
    return "rerun with strict=True to get the full traceback"


class AuditFailures:
    """Report an exception raised inside an audit once per exception type, or re-raise it when ``strict``.

    Args:
        owner: the callback's class name (starts every message).
        strict: re-raise instead of reporting.

    Example:
        >>> failures = AuditFailures("AttentionAudit", strict=False)
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     failures.report(ValueError("bad"), "fit", "val", epoch=0, step=10)
        ...     failures.report(ValueError("worse"), "fit", "val", epoch=1, step=20)   # same type: not repeated
        >>> len(caught), failures.count
        (1, 2)
        >>> AuditFailures("AttentionAudit", strict=True).report(ValueError("bad"), "fit", "val", 0, 10)
        Traceback (most recent call last):
        ...
        ValueError: bad
    """

    def __init__(self, owner: str, strict: bool) -> None:
        self.owner = owner
        self.strict = strict
        self.count = 0
        self._reported: Set[type] = set()

    def report(self, err: Exception, stage: str, split: str, epoch: Optional[int], step: Optional[int]) -> None:
        """Re-raise ``err`` when ``strict``; else warn (first time for its type) that the audit was skipped."""
        if self.strict:
            raise err
        self.count += 1
        where = f"the {stage} audit of the {split!r} split at epoch {epoch}, step {step}"
        if type(err) in self._reported:
            rank_zero_debug(f"{self.owner}: {where} failed again ({type(err).__name__}: {err}); skipped.")
            return
        self._reported.add(type(err))
        frames = traceback.extract_tb(err.__traceback__)
        origin = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        rank_zero_warn(f"{self.owner}: {where} failed with {type(err).__name__}: {err}{origin}. The audit was "
                       f"skipped and training continues; later {type(err).__name__}s of this callback are not "
                       f"reported again. Fix: {failure_fix(err)}. Pass strict=True to raise instead.")

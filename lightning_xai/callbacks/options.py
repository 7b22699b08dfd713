"""Validation of the options every audit callback shares (a :class:`MisconfigurationException` at ``__init__``)."""
from __future__ import annotations

from typing import Any, Optional

from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.callbacks.guard import PRECISION_OPTIONS
from lightning_xai.callbacks.subset import SPLITS

__all__ = ["check_audit_options"]


def check_audit_options(cls: str, *, num_samples: Optional[int], dataloader: str, batch_size: Optional[int],
                        seed: Any, precision: str, num_report_examples: Any, strict: Any) -> None:
    """Raise a :class:`MisconfigurationException` naming the first bad option of an audit callback ``cls``.

    Example:
        >>> check_audit_options("AttentionAudit", num_samples=0, dataloader="val", batch_size=None, seed=0,
        ...                     precision="auto", num_report_examples=16, strict=False)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit(num_samples) must be a positive int or None (whole split), got 0.
    """
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise MisconfigurationException(f"{cls}(num_samples) must be a positive int or None (whole split), "
                                        f"got {num_samples!r}.")
    if dataloader not in SPLITS:
        raise MisconfigurationException(f"{cls}(dataloader) must be one of {SPLITS}, got {dataloader!r}.")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise MisconfigurationException(f"{cls}(batch_size) must be a positive int or None, got {batch_size!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise MisconfigurationException(f"{cls}(seed) must be an int, got {seed!r}.")
    if precision not in PRECISION_OPTIONS:
        raise MisconfigurationException(f"{cls}(precision) must be one of {PRECISION_OPTIONS}, got {precision!r}.")
    if not isinstance(num_report_examples, int) or num_report_examples < 0:
        raise MisconfigurationException(f"{cls}(num_report_examples) must be an int >= 0, "
                                        f"got {num_report_examples!r}.")
    if not isinstance(strict, bool):
        raise MisconfigurationException(f"{cls}(strict) must be True or False, got {strict!r}.")

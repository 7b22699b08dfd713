"""Validation of the options every audit callback shares: at ``__init__`` (its own options) and at ``setup`` (its
place among the trainer's callbacks), each a :class:`MisconfigurationException` naming the option and the fix."""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional

from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.callbacks._audit.guard import PRECISION_OPTIONS
from lightning_xai.callbacks.output import warn_spawned_history
from lightning_xai.callbacks.subset import SPLITS

__all__ = ["check_audit_options", "check_monitors", "check_placement", "check_unique_prefix"]


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


def check_unique_prefix(callback: Any, callbacks: Iterable[Any]) -> None:
    """Raise a :class:`MisconfigurationException` when another audit callback of the trainer logs under
    ``callback.log_prefix``: both would write the same keys at the same step, and every logger would keep one
    of the two numbers under one name.

    Example:
        >>> from types import SimpleNamespace as Audit
        >>> first, second = Audit(log_prefix="attention_audit"), Audit(log_prefix="attention_audit")
        >>> check_unique_prefix(first, [first, second])
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: SimpleNamespace and SimpleNamespace both log under 'attention_audit/': their numbers would overwrite each other at the same step. Give each its own log_prefix=, e.g. SimpleNamespace(..., log_prefix='attention_audit_2').
    """
    prefix = callback.log_prefix
    for other in callbacks:
        if other is not callback and getattr(other, "log_prefix", None) == prefix:
            raise MisconfigurationException(
                f"{type(callback).__name__} and {type(other).__name__} both log under {prefix + '/'!r}: their numbers "
                f"would overwrite each other at the same step. Give each its own log_prefix=, e.g. "
                f"{type(other).__name__}(..., log_prefix={prefix + '_2'!r}).")


def _first_monitored_epoch(monitor: Any, check_val_every_n_epoch: Optional[int]) -> Optional[int]:
    """The first epoch at whose end ``monitor`` (an ``EarlyStopping`` or ``ModelCheckpoint``) reads its key, or
    ``None`` when it does not read it by epochs (step or time triggers) or tolerates a missing key."""
    validation = check_val_every_n_epoch or 1
    if hasattr(monitor, "patience"):  # EarlyStopping: at every validation (strict=False skips a missing key)
        return validation - 1 if getattr(monitor, "strict", True) else None
    every = getattr(monitor, "_every_n_epochs", 0)
    if getattr(monitor, "_every_n_train_steps", 0) or getattr(monitor, "_train_time_interval", None) or every < 1:
        return None
    return every * validation // math.gcd(every, validation) - 1  # the first validation of a saving epoch


def check_monitors(callback: Any, callbacks: Iterable[Any], check_val_every_n_epoch: Optional[int]) -> None:
    """Raise a :class:`MisconfigurationException` when an ``EarlyStopping`` or ``ModelCheckpoint`` monitors one of
    ``callback``'s keys at an epoch before its first audit, where the key does not exist yet (Lightning would stop
    the run there with "could not find the monitored key"). Between audits a key keeps its last value, so only
    the first audit matters; monitors that save by steps or time are not checked.

    Example:
        >>> from types import SimpleNamespace
        >>> audit = SimpleNamespace(log_prefix="attention_audit", every_n_epochs=2)
        >>> stop = SimpleNamespace(monitor="attention_audit/kendall_tau/attention_vs_gradient/mean", patience=3)
        >>> check_monitors(audit, [stop], check_val_every_n_epoch=1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: SimpleNamespace(every_n_epochs=2) first audits at the end of epoch 1, but SimpleNamespace(monitor='attention_audit/...') reads that key from the end of epoch 0, ...
    """
    every = int(callback.every_n_epochs or 0)
    if every < 1:  # audits by steps only: when the first one comes depends on the epoch's length
        return
    first_audit = every - 1
    for monitor in callbacks:
        key = getattr(monitor, "monitor", None)
        if not isinstance(key, str) or not key.startswith(callback.log_prefix + "/"):
            continue
        first_read = _first_monitored_epoch(monitor, check_val_every_n_epoch)
        if first_read is None or first_read >= first_audit:
            continue
        owner, kind = type(callback).__name__, type(monitor).__name__
        fixes = (f"{owner}(every_n_epochs=1) to audit at every epoch, "
                 + ("EarlyStopping(strict=False) to skip the epochs without the key" if hasattr(monitor, "patience")
                    else f"ModelCheckpoint(every_n_epochs={every}) to save at the audit's cadence"))
        raise MisconfigurationException(
            f"{owner}(every_n_epochs={every}) first audits at the end of epoch {first_audit}, but "
            f"{kind}(monitor={key!r}) reads that key from the end of epoch {first_read}, before it exists (Lightning "
            f"would stop the run there: 'could not find the monitored key'). Use {fixes}.")


def check_placement(callback: Any, audits: Iterable[Any], trainer: Any, stage: str) -> None:
    """At ``setup``: ``callback``'s keys are its own among the trainer's ``audits`` (:func:`check_unique_prefix`),
    no monitor reads them before they exist (:func:`check_monitors`, for ``fit``), and under a spawning launcher
    the user is told where the history lives (:func:`~lightning_xai.callbacks.output.warn_spawned_history`)."""
    check_unique_prefix(callback, audits)
    if stage == "fit":
        check_monitors(callback, trainer.callbacks, trainer.check_val_every_n_epoch)
    warn_spawned_history(trainer, type(callback).__name__)

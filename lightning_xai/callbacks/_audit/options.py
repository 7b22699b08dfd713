"""The names and options an audit callback is configured with, checked early: at ``__init__`` (its own options,
the method and ranking names it is given) and at ``setup`` (its place among the trainer's callbacks), each a
:class:`MisconfigurationException` naming the option and the fix — an unknown name fails now, not hours later.
"""

from __future__ import annotations

import difflib
import inspect
import math
from typing import Any, Iterable, Mapping, Optional, Sequence

from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.attribution.core import ATTRIBUTION_METHODS, check_method_options
from lightning_xai.callbacks._audit.guard import PRECISION_OPTIONS
from lightning_xai.callbacks._audit.output import warn_spawned_history
from lightning_xai.callbacks._audit.subset import SPLITS

__all__ = [
    "check_audit_batch",
    "check_audit_options",
    "check_budget",
    "check_cadence",
    "check_monitors",
    "check_names",
    "check_options_of_methods",
    "check_placement",
    "check_unique_prefix",
]


def check_audit_batch(cls: type) -> None:
    """Refuse (a ``TypeError`` when the class is made) an audit callback whose ``audit_batch`` does not take the
    shared prediction step's result as ``prediction``.

    Example:
        >>> class Old:
        ...     def audit_batch(self, model, batch, generator, indices): ...
        >>> check_audit_batch(Old)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: Old.audit_batch must take `prediction: Optional[AuditPrediction] = None` ...
    """
    if "prediction" not in inspect.signature(cls.audit_batch).parameters:
        raise TypeError(
            f"{cls.__name__}.audit_batch must take `prediction: Optional[AuditPrediction] = None` "
            "(the shared prediction step's result; use `prediction or self.predict(model, batch)`)."
        )


def check_names(owner: str, kind: str, names: Sequence[str], known: Iterable[str], hint: str = "") -> None:
    """Raise a :class:`MisconfigurationException` for the first of ``names`` not in ``known``, naming its close
    matches (``difflib``) and every known name.

    Args:
        owner: the callback, as the message names it.
        kind: what the names are (``"method"``, ``"ranking"``).
        names: the configured names.
        known: the accepted names.
        hint: appended to the message (e.g. how to register a new name).

    Example:
        >>> check_names("AttentionAudit", "method", ["gradiant"], ["gradient", "leave_one_out"])
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit: unknown method 'gradiant'; did you mean 'gradient'? Known: ['gradient', 'leave_one_out'].
    """
    accepted = sorted(set(known))
    for name in names:
        if name not in accepted:
            close = difflib.get_close_matches(name, accepted, n=3, cutoff=0.6)
            suggestion = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
            raise MisconfigurationException(f"{owner}: unknown {kind} {name!r}{suggestion} Known: {accepted}{hint}.")


def check_options_of_methods(owner: str, method_options: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise a :class:`MisconfigurationException` for the first option of ``method_options`` (method name ->
    ``attribute`` keyword options) that its method does not take, so a misspelled key fails at construction
    rather than at the first audit. Names that are not attribution methods (an audit's own rankings) are skipped.

    Example:
        >>> check_options_of_methods("AttentionAudit", {"integrated_gradients": {"n_step": 8}})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit(method_options): Method 'integrated_gradients' got unknown option(s) ['n_step'] ('n_step': did you mean 'n_steps'?); ...
    """
    for method, options in method_options.items():
        if method not in ATTRIBUTION_METHODS:
            continue
        if not isinstance(options, Mapping):
            raise MisconfigurationException(
                f"{owner}(method_options)[{method!r}] must be a dict of keyword options "
                f"for attribute(), got {type(options).__name__}."
            )
        try:
            check_method_options(method, options)
        except (TypeError, ValueError) as err:
            raise MisconfigurationException(f"{owner}(method_options): {err}") from None


def check_cadence(name: str, value: Optional[int], allow_zero: bool) -> None:
    """A :class:`MisconfigurationException` unless ``value`` is ``None`` or a (non-negative / positive) int.

    Example:
        >>> check_cadence("every_n_epochs", 0, allow_zero=True)
        >>> check_cadence("every_n_train_steps", 0, allow_zero=False)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: every_n_train_steps must be a positive int or None, got 0.
    """
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise MisconfigurationException(
            f"{name} must be {'a non-negative' if allow_zero else 'a positive'} int or None, got {value!r}."
        )


def check_budget(owner: str, budget: Any) -> Optional[float]:
    """``budget`` as a float (``None`` stays ``None``: no budget), or a :class:`MisconfigurationException`.

    Example:
        >>> check_budget("AttentionAudit", 0.05), check_budget("AttentionAudit", None)
        (0.05, None)
        >>> check_budget("AttentionAudit", 0)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit(budget) must be a share of the training time > 0 (e.g. 0.05) or None (no budget), got 0.
    """
    if budget is not None and (
        isinstance(budget, bool) or not isinstance(budget, (int, float)) or not 0 < budget < float("inf")
    ):
        raise MisconfigurationException(
            f"{owner}(budget) must be a share of the training time > 0 (e.g. 0.05) or None (no budget), got {budget!r}."
        )
    return None if budget is None else float(budget)


def check_audit_options(
    cls: str,
    *,
    every_n_epochs: Optional[int] = None,
    every_n_train_steps: Optional[int] = None,
    on_validate: bool = True,
    on_test: bool = True,
    num_samples: Optional[int],
    dataloader: str,
    batch_size: Optional[int],
    seed: Any,
    precision: str,
    num_report_examples: Any,
    strict: Any,
    budget: Any = None,
) -> None:
    """Raise a :class:`MisconfigurationException` naming the first bad option of an audit callback ``cls``.

    Example:
        >>> check_audit_options("AttentionAudit", num_samples=0, dataloader="val", batch_size=None, seed=0,
        ...                     precision="auto", num_report_examples=16, strict=False)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit(num_samples) must be a positive int or None (whole split), got 0.
        >>> check_audit_options("AttentionAudit", every_n_epochs=0, on_validate=False, on_test=False, num_samples=8,
        ...                     dataloader="val", batch_size=None, seed=0, precision="auto", num_report_examples=16,
        ...                     strict=False)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit would never run: set every_n_epochs >= 1, every_n_train_steps >= 1, on_validate or on_test.
    """
    check_cadence(f"{cls}(every_n_epochs)", every_n_epochs, allow_zero=True)
    check_cadence(f"{cls}(every_n_train_steps)", every_n_train_steps, allow_zero=False)
    if not every_n_epochs and not every_n_train_steps and not on_validate and not on_test:
        raise MisconfigurationException(
            f"{cls} would never run: set every_n_epochs >= 1, every_n_train_steps >= 1, on_validate or on_test."
        )
    if num_samples is not None and (
        isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
    ):
        raise MisconfigurationException(
            f"{cls}(num_samples) must be a positive int or None (whole split), got {num_samples!r}."
        )
    if dataloader not in SPLITS:
        raise MisconfigurationException(f"{cls}(dataloader) must be one of {SPLITS}, got {dataloader!r}.")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise MisconfigurationException(f"{cls}(batch_size) must be a positive int or None, got {batch_size!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise MisconfigurationException(f"{cls}(seed) must be an int, got {seed!r}.")
    if precision not in PRECISION_OPTIONS:
        raise MisconfigurationException(f"{cls}(precision) must be one of {PRECISION_OPTIONS}, got {precision!r}.")
    if not isinstance(num_report_examples, int) or num_report_examples < 0:
        raise MisconfigurationException(f"{cls}(num_report_examples) must be an int >= 0, got {num_report_examples!r}.")
    if not isinstance(strict, bool):
        raise MisconfigurationException(f"{cls}(strict) must be True or False, got {strict!r}.")
    check_budget(cls, budget)


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
                f"{type(other).__name__}(..., log_prefix={prefix + '_2'!r})."
            )


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
        fixes = f"{owner}(every_n_epochs=1) to audit at every epoch, " + (
            "EarlyStopping(strict=False) to skip the epochs without the key"
            if hasattr(monitor, "patience")
            else f"ModelCheckpoint(every_n_epochs={every}) to save at the audit's cadence"
        )
        raise MisconfigurationException(
            f"{owner}(every_n_epochs={every}) first audits at the end of epoch {first_audit}, but "
            f"{kind}(monitor={key!r}) reads that key from the end of epoch {first_read}, before it exists (Lightning "
            f"would stop the run there: 'could not find the monitored key'). Use {fixes}."
        )


def check_placement(callback: Any, audits: Iterable[Any], trainer: Any, stage: str) -> None:
    """At ``setup``: ``callback``'s keys are its own among the trainer's ``audits`` (:func:`check_unique_prefix`),
    no monitor reads them before they exist (:func:`check_monitors`, for ``fit``), and under a spawning launcher
    the user is told where the history lives (:func:`~lightning_xai.callbacks._audit.output.warn_spawned_history`)."""
    check_unique_prefix(callback, audits)
    if stage == "fit":
        check_monitors(callback, trainer.callbacks, trainer.check_val_every_n_epoch)
    warn_spawned_history(trainer, type(callback).__name__)

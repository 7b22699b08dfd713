"""When an audit runs: every n validation epochs and/or optimizer steps of ``fit``, in ``validate`` and ``test``."""
from __future__ import annotations

from typing import Any, Callable, Optional

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from typing_extensions import override

__all__ = ["AuditSchedule", "check_cadence"]


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
            f"{name} must be {'a non-negative' if allow_zero else 'a positive'} int or None, got {value!r}.")


class AuditSchedule(Callback):
    """The Lightning hooks that decide when :meth:`run_audit` runs (mixed into
    :class:`~lightning_xai.callbacks.AuditCallback`, which sets the attributes read here).

    * at the end of every ``every_n_epochs``-th epoch of ``fit`` — after its validation, or at the train epoch's
      end when no validation ran — once per epoch, on the split ``dataloader``;
    * after every ``every_n_train_steps``-th optimizer step, once per step;
    * at the end of ``trainer.validate`` (``"val"``) and ``trainer.test`` (``"test"``) when ``on_validate`` /
      ``on_test``. Never during the sanity check.

    Example:
        >>> from lightning_xai.callbacks import AttentionAudit
        >>> isinstance(AttentionAudit(), AuditSchedule)
        True
    """

    every_n_epochs: int
    every_n_train_steps: Optional[int]
    on_validate: bool
    on_test: bool
    dataloader: str
    _epoch_audited: Optional[int]
    _last_step_audited: Optional[int]

    #: ``run_audit(trainer, pl_module, stage, split)``: defined by :class:`~lightning_xai.callbacks.AuditCallback`
    run_audit: Callable[..., Any]

    @override
    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.sanity_checking:
            return
        fn = trainer.state.fn
        if fn == "fit":
            self._epoch_audit(trainer, pl_module)
        elif fn == "validate" and self.on_validate:
            self.run_audit(trainer, pl_module, "validate", "val")

    def _epoch_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        epoch = trainer.current_epoch
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0 and self._epoch_audited != epoch:
            self._epoch_audited = epoch
            self.run_audit(trainer, pl_module, "fit", self.dataloader)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # Runs after the epoch's validation: audits here only when no validation ran this epoch.
        self._epoch_audit(trainer, pl_module)

    @override
    def on_test_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.on_test:
            self.run_audit(trainer, pl_module, "test", "test")

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        n = self.every_n_train_steps
        step = trainer.global_step
        if n and step > 0 and step % n == 0 and step != self._last_step_audited:
            self._last_step_audited = step
            self.run_audit(trainer, pl_module, "fit", self.dataloader)

"""When an audit runs: every n validation epochs and/or optimizer steps of ``fit``, in ``validate`` and ``test``."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

import pytorch_lightning as pl
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_xai.callbacks.cost import AuditCost
from lightning_xai.callbacks.isolation import AuditFailures
from lightning_xai.lightning_compat import Callback

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

    Every scheduled audit goes through :meth:`scheduled_audit`: an exception inside it is reported and the audit
    skipped (:class:`~lightning_xai.callbacks.isolation.AuditFailures`; ``strict`` re-raises), and its wall time
    is logged as ``<prefix>/cost/seconds``. At the end of every training epoch in which the callback audited,
    ``<prefix>/cost/share`` = its audits' time / the epoch's training time without audits
    (:class:`~lightning_xai.callbacks.cost.AuditCost`); after the first such epoch one line (``rank_zero_info``)
    says what the first audit cost.

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

    _failures: AuditFailures
    _cost: AuditCost

    #: ``run_audit(trainer, pl_module, stage, split)``: defined by :class:`~lightning_xai.callbacks.AuditCallback`
    run_audit: Callable[..., Any]
    #: ``_log(trainer, stage, metrics)``: defined by :class:`~lightning_xai.callbacks.AuditCallback`
    _log: Callable[..., Any]

    def scheduled_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str
                        ) -> Optional[Any]:
        """:meth:`run_audit`, isolated and clocked: the result, or ``None`` when the audit failed (and was
        reported; with ``strict`` the exception propagates)."""
        start = time.perf_counter()
        try:
            result = self.run_audit(trainer, pl_module, stage, split)
        except Exception as err:  # noqa: BLE001 - any failure of an audit is reported, training goes on
            self._failures.report(err, stage, split, trainer.current_epoch, trainer.global_step)
            return None
        seconds = time.perf_counter() - start
        self._cost.audited(seconds)
        self._log(trainer, stage, {"cost/seconds": seconds})
        if stage != "fit" and not self._cost.announced:
            self._cost.announced = True
            rank_zero_info(self._cost.announcement(type(self).__name__))
        return result

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._cost.epoch_started()

    def _epoch_cost(self, trainer: "pl.Trainer") -> None:
        others = [getattr(c, "_cost", None) for c in trainer.callbacks]
        spent = self._cost.epoch_ended([o for o in others if isinstance(o, AuditCost)])
        if spent is None:
            return
        audits, training = spent
        metrics: Dict[str, float] = {"cost/share": audits / training if training > 0 else float("nan")}
        self._log(trainer, "fit", metrics)
        if not self._cost.announced:
            self._cost.announced = True
            rank_zero_info(self._cost.announcement(type(self).__name__, audits, training))

    @override
    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.sanity_checking:
            return
        fn = trainer.state.fn
        if fn == "fit":
            self._epoch_audit(trainer, pl_module)
        elif fn == "validate" and self.on_validate:
            self.scheduled_audit(trainer, pl_module, "validate", "val")

    def _epoch_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        epoch = trainer.current_epoch
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0 and self._epoch_audited != epoch:
            self._epoch_audited = epoch
            self.scheduled_audit(trainer, pl_module, "fit", self.dataloader)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # Runs after the epoch's validation: audits here only when no validation ran this epoch.
        self._epoch_audit(trainer, pl_module)
        self._epoch_cost(trainer)

    @override
    def on_test_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.on_test:
            self.scheduled_audit(trainer, pl_module, "test", "test")

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        n = self.every_n_train_steps
        step = trainer.global_step
        if n and step > 0 and step % n == 0 and step != self._last_step_audited:
            self._last_step_audited = step
            self.scheduled_audit(trainer, pl_module, "fit", self.dataloader)

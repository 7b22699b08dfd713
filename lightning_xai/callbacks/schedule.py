"""When an audit runs: every n validation epochs and/or optimizer steps of ``fit``, in ``validate`` and ``test``."""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytorch_lightning as pl
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_xai.callbacks.budget import MIN_AUDIT_SECONDS, Default, Plan, describe, limited_size, plan
from lightning_xai.callbacks.cost import AuditCost
from lightning_xai.callbacks.distributed import agreed, shared_failure
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

    **Cost budget** (``budget=0.05``, the default; ``None`` switches it off). After the first audit of ``fit``
    the callback knows the audit's seconds per example and the training time since training started (steps,
    data, validation; other audit callbacks' audits left out), and sizes itself to spend at most ``budget`` of
    the training time (:func:`~lightning_xai.callbacks.budget.plan`): it audits every ``k``-th epoch first
    (``k <= 10``), and only if that is not enough shrinks the audit subset, never below 128 examples — the first
    ``N`` examples of the same seeded draw, so every later audit reads that one fixed subset (a part of the first
    audit's). A ``num_samples``, ``every_n_epochs`` or ``every_n_train_steps`` passed by the user is kept (the
    budget then only measures), and so is all of an audit that took under ``budget_min_seconds`` (5 s). The
    plan is logged once as ``<prefix>/budget/num_samples``,
    ``/every_n_epochs`` and ``/share`` (the first audit's measured share), printed in one line
    (``rank_zero_info``) and checkpointed. Subclasses with their own smaller default subset (``SanityCheck``,
    ``AdversarialSearchAudit``) keep it.

    ``limit_<split>_batches`` caps the audit subset of that split: an int ``N`` audits at most ``N ×`` the
    loader's batch size examples, a fraction ``f`` audits ``f`` of the subset (``0``, which switches validation
    off, leaves the audit as it is). ``fast_dev_run`` sets these limits to its batch count, so it audits one
    batch's worth of examples, and plans no budget.

    Example:
        >>> from lightning_xai.callbacks import AttentionAudit
        >>> isinstance(AttentionAudit(), AuditSchedule)
        True
    """

    every_n_epochs: int
    every_n_train_steps: Optional[int]
    num_samples: Optional[int]
    _subsets: Dict[str, List[int]]
    _batches: Dict[str, Any]
    on_validate: bool
    on_test: bool
    dataloader: str
    _epoch_audited: Optional[int]
    _last_step_audited: Optional[int]

    #: the budget keeps the configured size and cadence of an audit that took less than this (seconds)
    budget_min_seconds: float = MIN_AUDIT_SECONDS
    _failures: AuditFailures
    _cost: AuditCost

    #: ``run_audit(trainer, pl_module, stage, split)``: defined by :class:`~lightning_xai.callbacks.AuditCallback`
    run_audit: Callable[..., Any]
    #: ``_loader(trainer, split)``: defined by :class:`~lightning_xai.callbacks.AuditCallback`
    _loader: Callable[..., Any]
    #: ``_log(trainer, stage, metrics)``: defined by :class:`~lightning_xai.callbacks.AuditCallback`
    _log: Callable[..., Any]

    # --- the cost budget (lightning_xai.callbacks.budget) ----------------------------------------------------
    def init_budget(self, budget: Optional[float], num_samples: Optional[int]) -> None:
        """Check ``budget`` and note which of ``num_samples`` / the cadence the user chose (called by
        ``AuditCallback.__init__`` after it set the cadence attributes)."""
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or
                                   not 0 < budget < float("inf")):
            raise MisconfigurationException(f"{type(self).__name__}(budget) must be a share of the training time "
                                            f"> 0 (e.g. 0.05) or None (no budget), got {budget!r}.")
        self.budget = None if budget is None else float(budget)
        self._fixed_samples = not isinstance(num_samples, Default)
        self._fixed_cadence = not isinstance(self.every_n_epochs, Default) or bool(self.every_n_train_steps)
        self.num_samples = None if num_samples is None else int(num_samples)
        self.every_n_epochs = int(self.every_n_epochs)
        self.plan: Optional[Plan] = None
        self._cadence, self._cadence_offset, self._planned_samples = 1, 0, None
        self._budget_mark: Optional[Tuple[float, float]] = None

    def audit_size(self, trainer: "pl.Trainer", split: str, loader: Any) -> Optional[int]:
        """Size of the audit subset of ``split``: the budget's plan, else ``num_samples``, capped by the trainer's
        ``limit_<split>_batches`` (:func:`~lightning_xai.callbacks.budget.limited_size`; ``fast_dev_run`` sets
        them to its batch count)."""
        size = self._planned_samples or self.num_samples
        limit = getattr(trainer, f"limit_{split}_batches", None)
        try:
            total: Optional[int] = len(loader.dataset)
        except TypeError:
            total = None
        return limited_size(size, limit, getattr(loader, "batch_size", None) or 1, total)

    def _audit_clocks(self, trainer: "pl.Trainer") -> float:
        return sum(c._cost.total for c in trainer.callbacks if isinstance(getattr(c, "_cost", None), AuditCost))

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._budget_mark = (time.perf_counter(), self._audit_clocks(trainer))

    def _training_since_mark(self, trainer: "pl.Trainer", now: float) -> float:
        if self._budget_mark is None:
            return 0.0
        started, audits = self._budget_mark
        return now - started - (self._audit_clocks(trainer) - audits)

    def _apply_budget(self, trainer: "pl.Trainer", split: str, seconds: float, training: float) -> None:
        """After the first audit of ``fit``: size the subset and cadence to the budget, log the plan."""
        audited = len(self._subsets.get(split, ()))
        if self.budget is None or self.plan is not None or not audited or training <= 0 or trainer.fast_dev_run:
            return
        with shared_failure(trainer):  # a failure on one process: every process raises, none waits in the broadcast
            limited = self.audit_size(trainer, split, self._loader(trainer, split)) != self.num_samples
            cheap = seconds < self.budget_min_seconds
            chosen = plan(seconds / audited, training, self.budget, audited,
                          fixed_samples=self._fixed_samples or limited or cheap,
                          fixed_cadence=self._fixed_cadence or cheap)
        chosen = trainer.strategy.broadcast(chosen, src=0)  # every process audits the same subset, same cadence
        self.plan = chosen
        if chosen.cadence > 1:  # the next audit comes every_n_epochs * cadence epochs after this one
            self._cadence, self._cadence_offset = chosen.cadence, trainer.current_epoch + 1
        if chosen.num_samples < audited:
            self._planned_samples = chosen.num_samples
            self._subsets.pop(split, None)  # the first N of the same seeded draw: a subset of the first audit's
            self._batches.pop(split, None)
        measured = seconds / training
        with shared_failure(trainer):  # logging the plan failed on one process: an audit failure on all
            self._log(trainer, "fit", {"budget/num_samples": float(chosen.num_samples), "budget/share": measured,
                                       "budget/every_n_epochs": float(self.every_n_epochs * chosen.cadence)})
            unit = "epochs" if self.every_n_epochs else "scheduled steps"
            rank_zero_info(describe(type(self).__name__, chosen, self.budget, measured, unit,
                                    self.every_n_epochs or self.every_n_train_steps))

    def budget_state(self) -> Dict[str, Any]:
        """The plan, checkpointed so that a resumed run audits the same subset at the same cadence."""
        return {"plan": None if self.plan is None else vars(self.plan).copy(), "cadence_offset": self._cadence_offset}

    def load_budget_state(self, state: Optional[Dict[str, Any]]) -> None:
        if state and state.get("plan"):
            self.plan = Plan(**state["plan"])
            self._cadence, self._cadence_offset = self.plan.cadence, int(state.get("cadence_offset", 0))
            self._planned_samples = self.plan.num_samples

    def scheduled_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str
                        ) -> Optional[Any]:
        """:meth:`run_audit`, isolated and clocked: the result, or ``None`` when the audit failed (and was
        reported; with ``strict`` the exception propagates). The first audit of ``fit`` sets the budget's plan."""
        start = time.perf_counter()
        training = self._training_since_mark(trainer, start) if stage == "fit" else 0.0
        try:  # every step agrees across processes (distributed.shared_failure): all report, or all raise
            result = self.run_audit(trainer, pl_module, stage, split)
            seconds = time.perf_counter() - start
            self._cost.audited(seconds)
            agreed(trainer, self._log, trainer, stage, {"cost/seconds": seconds})
            if stage == "fit":
                self._apply_budget(trainer, split, seconds, training)
        except Exception as err:  # noqa: BLE001 - any failure of an audit is reported, training goes on
            self._failures.report(err, stage, split, trainer.current_epoch, trainer.global_step)
            return None
        if stage == "fit":
            self._budget_mark = (time.perf_counter(), self._audit_clocks(trainer))
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
        try:  # a logger failing on one process: reported (or raised) on every process alike
            agreed(trainer, self._log, trainer, "fit", metrics)
        except Exception as err:  # noqa: BLE001 - as a failed audit
            self._failures.report(err, "fit", self.dataloader, trainer.current_epoch, trainer.global_step)
            return
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
        epoch, every = trainer.current_epoch, self.every_n_epochs * self._cadence
        if every and (epoch + 1 - self._cadence_offset) % every == 0 and self._epoch_audited != epoch:
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

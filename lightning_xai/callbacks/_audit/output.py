"""Where audit results go: the checkpointed history, the trainer's loggers, a progress bar while it runs."""

from __future__ import annotations

import sys
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn

__all__ = [
    "RunCounter",
    "ScalarLog",
    "add_record",
    "audit_progress",
    "log_scalars",
    "progress_bar",
    "publish_scalars",
    "restored_history",
    "warn_spawned_history",
]


def add_record(history: List[Dict[str, Any]], record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``history`` with ``record`` appended, replacing a record of the same stage, epoch, step and split.

    Example:
        >>> h = add_record([], {"stage": "fit", "epoch": 0, "global_step": 5, "split": "val", "metrics": {"m": 1}})
        >>> [r["metrics"] for r in add_record(h, dict(h[0], metrics={"m": 2}))]
        [{'m': 2}]
    """
    kept = [r for r in history if _key(r) != _key(record)]
    return [*kept, record]


def _key(record: Mapping[str, Any]) -> tuple:
    return record.get("run", 0), record["stage"], record["epoch"], record["global_step"], record["split"]


class RunCounter:
    """Which run a callback is in: every Trainer object it is set up by after the first starts a new run, so the
    same callback in a second ``Trainer`` keeps the first run's records beside its own (``record["run"]``).

    Example:
        >>> class Trainer:
        ...     pass
        >>> runs, first, second = RunCounter(), Trainer(), Trainer()
        >>> runs.enter(first, "audit"), runs.enter(first, "audit"), runs.enter(second, "audit"), runs.run
        (False, False, True, 1)
    """

    def __init__(self) -> None:
        self.run = 0
        self._trainer: Optional["weakref.ref[Any]"] = None

    def enter(self, trainer: Any, owner: str) -> bool:
        """Note that ``trainer`` sets the callback up; whether it starts the next run (a Trainer other than the
        last one)."""
        last = None if self._trainer is None else self._trainer()
        new = self._trainer is not None and last is not trainer
        if new:
            self.run += 1
            rank_zero_info(
                f"{owner} is set up by another Trainer: its history keeps the earlier runs' records and "
                f"adds this one's with run={self.run} (callback.history[i]['run'])."
            )
        self._trainer = weakref.ref(trainer)
        return new

    def restored(self, history: List[Dict[str, Any]]) -> None:
        """After a checkpoint's history is loaded: continue the latest run it holds."""
        self.run = max([self.run, *(r.get("run", 0) for r in history)])

    def __getstate__(self) -> Dict[str, Any]:  # a weak reference does not pickle (ddp_spawn, deepcopy)
        return {"run": self.run, "_trainer": None}


def warn_spawned_history(trainer: "pl.Trainer", owner: str) -> None:
    """Under a launcher that runs the training in new processes (``strategy="ddp_spawn"``, ``"ddp_fork"``,
    ``"ddp_notebook"``), say that ``history`` and ``latest`` stay in those processes: Lightning sends back only the
    weights and ``callback_metrics``, so the calling process's callback object keeps an empty history."""
    launcher = getattr(trainer.strategy, "launcher", None)
    method = getattr(launcher, "_start_method", None)
    if method is not None:
        rank_zero_warn(
            f"{owner}: under the {method!r} multiprocessing launcher ({type(trainer.strategy).__name__}) "
            "the audits run in worker processes, and Lightning brings back only the weights and "
            "callback_metrics: callback.history and callback.latest stay empty in the process that called "
            "fit. The numbers are in the loggers (CSVLogger, W&B) and in checkpoints (the callback's "
            "state); use strategy='ddp' to keep them on the callback."
        )


def restored_history(current: List[Dict[str, Any]], saved: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The history after loading a checkpoint's ``saved`` one into a callback that holds ``current``.

    A fresh callback (resume) takes ``saved``. One that already holds ``saved`` followed by later audits (the same
    run restoring an earlier checkpoint, e.g. ``trainer.test(ckpt_path="best")``) keeps those later audits too:
    restoring weights does not undo audits that ran.

    Example:
        >>> a, b = ({"stage": "fit", "epoch": e, "global_step": e, "split": "val", "metrics": {}} for e in (0, 1))
        >>> [r["epoch"] for r in restored_history([a, b], [a])], [r["epoch"] for r in restored_history([], [a])]
        ([0, 1], [0])
    """
    saved = [dict(r, metrics=dict(r["metrics"])) for r in saved]
    if len(current) > len(saved) and [_key(r) for r in current[: len(saved)]] == [_key(r) for r in saved]:
        return saved + [dict(r, metrics=dict(r["metrics"])) for r in current[len(saved) :]]
    return saved


def log_scalars(trainer: "pl.Trainer", prefix: str, metrics: Mapping[str, Any]) -> bool:
    """Send the numeric ``metrics`` (as ``prefix/key``) to every logger at ``trainer.global_step``.

    NaN values are sent as NaN: a metric undefined for a whole audit is logged as undefined, never dropped (the
    audit warns about it, :func:`~lightning_xai.callbacks._audit.failures.warn_undefined`).

    Returns:
        Whether the trainer has a logger (loggers are rank-zero only by construction).

    Example:
        >>> class NoLogger:
        ...     loggers = []
        >>> log_scalars(NoLogger(), "audit", {"m/mean": 0.5})
        False
    """
    flat = _scalars(prefix, metrics)
    if not trainer.loggers:
        return False
    for logger in trainer.loggers:
        logger.log_metrics(dict(flat), step=trainer.global_step)
    return True


def _scalars(prefix: str, metrics: Mapping[str, Any]) -> Dict[str, float]:
    return {
        f"{prefix}/{k}": float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def publish_scalars(trainer: "pl.Trainer", prefix: str, metrics: Mapping[str, Any]) -> None:
    """Put the numeric ``metrics`` (as ``prefix/key``, 0-dim float tensors) into ``trainer.callback_metrics``.

    That is where ``ModelCheckpoint`` and ``EarlyStopping`` read their ``monitor`` key. An audit runs in
    ``on_validation_epoch_end`` (or ``on_train_epoch_end`` / ``on_train_batch_end``), before the monitoring
    callbacks' ``on_validation_end`` / ``on_train_epoch_end``, so they see this audit's values. Lightning empties
    ``callback_metrics`` only when a run (or its sanity check) starts. NaN values are published as NaN, which
    ``ModelCheckpoint`` never counts as an improvement and ``EarlyStopping`` (``check_finite=True``, its default)
    stops on.

    Example:
        >>> class Trainer:
        ...     callback_metrics = {}
        >>> trainer = Trainer()
        >>> publish_scalars(trainer, "audit", {"m/mean": 0.5, "flag": True})
        >>> trainer.callback_metrics
        {'audit/m/mean': tensor(0.5000)}
    """
    board = trainer.callback_metrics
    for key, value in _scalars(prefix, metrics).items():
        board[key] = torch.tensor(value)


def progress_bar(trainer: "pl.Trainer", total: int, description: str) -> Optional[Any]:
    """Lightning's tqdm bar for an audit, shown (rank zero, progress bar enabled) once it takes over 2 s.

    Example:
        >>> class Quiet:
        ...     progress_bar_callback = None
        >>> progress_bar(Quiet(), 3, "AttentionAudit (val)") is None
        True
    """
    progress = trainer.progress_bar_callback
    if progress is None or not trainer.is_global_zero or not getattr(progress, "is_enabled", False):
        return None
    try:
        from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm
    except ImportError:  # pragma: no cover - Lightning without tqdm
        return None
    return Tqdm(
        total=total, desc=description, leave=False, delay=2.0, dynamic_ncols=True, file=sys.stderr, unit="batch"
    )


@contextmanager
def audit_progress(trainer: "pl.Trainer", total: int, description: str) -> Iterator[Callable[[], None]]:
    """A step function advancing the audit's :func:`progress_bar` (a no-op without one), the bar closed on exit.

    Example:
        >>> class Quiet:
        ...     progress_bar_callback = None
        >>> with audit_progress(Quiet(), 3, "AttentionAudit (val)") as advance:
        ...     advance()
    """
    bar = progress_bar(trainer, total, description)
    try:
        yield (lambda: None) if bar is None else (lambda: bar.update(1))
    finally:
        if bar is not None:
            bar.close()


class ScalarLog:
    """Where an audit callback's scalars go: ``trainer.callback_metrics`` (:func:`publish_scalars`) and every logger
    (:func:`log_scalars`), with one warning when the trainer has no logger.

    Example:
        >>> class Logger:
        ...     def log_metrics(self, metrics, step):
        ...         print(metrics, step)
        >>> class Trainer:
        ...     callback_metrics, loggers, global_step = {}, [Logger()], 3
        >>> ScalarLog("AttentionAudit")(Trainer(), "attention_audit", {"m": 0.5})
        {'attention_audit/m': 0.5} 3
    """

    def __init__(self, owner: str) -> None:
        self.owner, self.warned = owner, False

    def __call__(self, trainer: "pl.Trainer", prefix: str, metrics: Mapping[str, Any]) -> None:
        publish_scalars(trainer, prefix, metrics)
        if not log_scalars(trainer, prefix, metrics) and not self.warned:
            rank_zero_warn(
                f"{self.owner}: the trainer has no logger; audit results are kept in callback.history (and "
                "written by lightning_xai.reporting.AuditReport if present)."
            )
            self.warned = True

"""Where audit results go: the checkpointed history, the trainer's loggers, a progress bar while it runs."""
from __future__ import annotations

import math
import sys
from typing import Any, Dict, List, Mapping, Optional

import pytorch_lightning as pl

__all__ = ["add_record", "log_scalars", "progress_bar"]


def add_record(history: List[Dict[str, Any]], record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``history`` with ``record`` appended, replacing a record of the same stage, epoch, step and split.

    Example:
        >>> h = add_record([], {"stage": "fit", "epoch": 0, "global_step": 5, "split": "val", "metrics": {"m": 1}})
        >>> [r["metrics"] for r in add_record(h, dict(h[0], metrics={"m": 2}))]
        [{'m': 2}]
    """
    key = (record["stage"], record["epoch"], record["global_step"], record["split"])
    kept = [r for r in history if (r["stage"], r["epoch"], r["global_step"], r["split"]) != key]
    return [*kept, record]


def log_scalars(trainer: "pl.Trainer", prefix: str, metrics: Mapping[str, Any]) -> bool:
    """Send the numeric, non-NaN ``metrics`` (as ``prefix/key``) to every logger at ``trainer.global_step``.

    Returns:
        Whether the trainer has a logger (loggers are rank-zero only by construction).

    Example:
        >>> class NoLogger:
        ...     loggers = []
        >>> log_scalars(NoLogger(), "audit", {"m/mean": 0.5})
        False
    """
    flat = {f"{prefix}/{k}": float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not trainer.loggers:
        return False
    for logger in trainer.loggers:
        logger.log_metrics({k: v for k, v in flat.items() if not math.isnan(v)}, step=trainer.global_step)
    return True


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
    return Tqdm(total=total, desc=description, leave=False, delay=2.0, dynamic_ncols=True, file=sys.stderr,
                unit="batch")

"""Where a run's report goes: with the run, one report per run, never over another run's.

* the first logger with a versioned ``log_dir`` (``TensorBoardLogger``, ``CSVLogger``: ``<save_dir>/<name>/
  version_N``) → ``<log_dir>/xai_report``;
* else a ``WandbLogger`` → its run's own folder (``<save_dir>/wandb/<offline-run-…>/files/xai_report``);
* else (no logger) → ``<default_root_dir>/xai_report/version_N``, ``N`` the first free number, as the loggers
  version their folders.

With a ``WandbLogger`` the page is also logged into the W&B run as ``wandb.Html`` media
(:func:`log_report_to_wandb`), so an offline run directory holds it whatever the folder above.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from lightning_xai.reporting.wandb_logging import _import_wandb, is_wandb_logger

__all__ = ["next_version_directory", "run_report_directory", "log_report_to_wandb"]

REPORT_FOLDER = "xai_report"


def next_version_directory(root: str) -> str:
    """``root/version_N`` with ``N`` one past the largest existing ``version_*`` folder (0 when none).

    Example:
        >>> import tempfile, os
        >>> root = tempfile.mkdtemp()
        >>> first = next_version_directory(root); os.makedirs(first)
        >>> os.path.basename(first), os.path.basename(next_version_directory(root))
        ('version_0', 'version_1')
    """
    numbers = [
        int(m.group(1))
        for name in (os.listdir(root) if os.path.isdir(root) else [])
        for m in [re.fullmatch(r"version_(\d+)", name)]
        if m and os.path.isdir(os.path.join(root, name))
    ]
    return os.path.join(root, f"version_{max(numbers) + 1 if numbers else 0}")


def _local_choice(trainer: Any) -> str:
    """The report folder, decided on rank zero (a W&B run exists only there)."""
    for logger in trainer.loggers:
        log_dir = getattr(logger, "log_dir", None)
        if isinstance(log_dir, str) and log_dir:
            return os.path.join(log_dir, REPORT_FOLDER)
    for logger in trainer.loggers:
        if is_wandb_logger(logger):
            run_dir = getattr(logger.experiment, "dir", None)
            if isinstance(run_dir, str) and run_dir:
                return os.path.join(run_dir, REPORT_FOLDER)
    root = next((getattr(lg, "save_dir", None) for lg in trainer.loggers if getattr(lg, "save_dir", None)), None)
    return next_version_directory(os.path.join(root or trainer.default_root_dir, REPORT_FOLDER))


def run_report_directory(trainer: Any) -> str:
    """The folder of this run's report (call on every process: the choice is broadcast from rank zero).

    Example:
        >>> import tempfile, pytorch_lightning as pl
        >>> from pytorch_lightning.loggers import CSVLogger
        >>> root = tempfile.mkdtemp()
        >>> trainer = pl.Trainer(logger=CSVLogger(root, name="run"), default_root_dir=root)
        >>> os.path.relpath(run_report_directory(trainer), root)
        'run/version_0/xai_report'
    """
    choice: Optional[str] = _local_choice(trainer) if trainer.is_global_zero else None
    return trainer.strategy.broadcast(choice)


def log_report_to_wandb(logger: Any, page: str, step: int, key: str = "xai_report") -> None:
    """Log the report page into a ``WandbLogger``'s run as ``wandb.Html`` media (call on rank zero).

    The page is self-contained (its own styles, images as ``data:`` URIs), so W&B's stylesheet is not injected.
    """
    wandb = _import_wandb()
    logger.experiment.log({key: wandb.Html(page, inject=False), "trainer/global_step": step})

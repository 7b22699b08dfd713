"""``AuditReport``: turn the audit callbacks' results into a report, PNGs and W&B tables as training goes.

Add it next to the audit callbacks. After every audit it (on rank zero only)

* writes ``report.html`` (self-contained: no CDN, no script; legend and colour scale; all text escaped) and
  matplotlib PNGs into ``dirpath`` (default: the run's own folder, see
  :func:`~lightning_xai.reporting.run_directory.run_report_directory`), whatever the logger (or none). The page
  opens with a headline in words, then the training's own logged metrics (kept by the callback from
  ``trainer.callback_metrics``, no logger needed) beside the audit metrics on one epoch axis, then per audit:
  the erasure comparison (every ranking on one axes), agreement as small multiples, histograms, token heatmaps
  (with ``"integrated_hessians"`` among an AttentionAudit's methods, also each example's strongest token pairs;
  for a generator, a few examples' source tokens × target tokens heatmaps of every map, one row per target step);
* with a ``WandbLogger``, logs a ``wandb.Table`` of the audited examples, HTML token-heatmap panels (one per
  method and all maps side by side), histograms of the per-example values, a generator's step maps (a table of
  source × target cells and their heatmaps) and, when the run ends, the report page itself (``wandb.Html`` under
  ``xai_report``).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Dict, List, Optional

import pytorch_lightning as pl
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_xai.lightning_compat import Callback
from lightning_xai.reporting.curves import TrainingLog
from lightning_xai.reporting.page import write_report
from lightning_xai.reporting.protocol import ReportableAudit
from lightning_xai.reporting.run_directory import log_report_to_wandb, run_report_directory
from lightning_xai.reporting.step_heatmaps import MAX_STEP_EXAMPLES
from lightning_xai.reporting.summary import final_results, format_summary
from lightning_xai.reporting.wandb_logging import is_wandb_logger, log_audit_to_wandb

__all__ = ["AuditReport"]


class AuditReport(Callback):
    """Write the audit report (HTML + PNGs) and W&B tables/panels after every audit of the audit callbacks.

    Args:
        dirpath: where ``report.html`` and the PNGs go (default: ``<log_dir>/xai_report`` of the first
            versioned logger, else the W&B run's folder, else ``<default_root_dir>/xai_report/version_N``).
        filename: the report's file name.
        png: also write matplotlib PNGs (embedded in the report as ``data:`` URIs).
        wandb: log tables, HTML panels and histograms when the trainer has a ``WandbLogger``.
        max_examples: HTML heatmaps per audit callback.
        heatmap_pngs: PNG heatmaps per audit callback, drawn when fit/validate/test ends.
        title: the report's heading.
        merge_word_pieces: show HF word pieces (``##`` continuations, ``Ġ``/``▁`` word starts) as whole words,
            each word's score the sum of its pieces' scores.
        step_heatmaps: generator examples per audit shown (and logged to W&B) as source tokens × target tokens
            heatmaps, one per map (attention and each method), one row per target step.

    Example:
        >>> import pytorch_lightning as pl
        >>> from lightning_xai.callbacks import AttentionAudit
        >>> trainer = pl.Trainer(callbacks=[AttentionAudit(), AuditReport()], logger=False,
        ...                      enable_progress_bar=False, enable_model_summary=False)
        >>> [type(c).__name__ for c in trainer.callbacks][:2]
        ['AttentionAudit', 'AuditReport']
    """

    def __init__(
        self,
        dirpath: Optional[str] = None,
        filename: str = "report.html",
        png: bool = True,
        wandb: bool = True,
        max_examples: int = 8,
        heatmap_pngs: int = 4,
        title: str = "lightning_xai audit report",
        merge_word_pieces: bool = False,
        step_heatmaps: int = MAX_STEP_EXAMPLES,
    ) -> None:
        super().__init__()
        if not filename.endswith(".html") or os.sep in filename:
            raise MisconfigurationException(
                f"AuditReport(filename) must be a file name ending in .html, got {filename!r}."
            )
        for name, value in (("max_examples", max_examples), ("step_heatmaps", step_heatmaps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise MisconfigurationException(f"AuditReport({name}) must be an int >= 0, got {value!r}.")
        self.dirpath = dirpath
        self.filename = filename
        self.png = png
        self.wandb = wandb
        self.max_examples = max_examples
        self.heatmap_pngs = heatmap_pngs
        self.title = title
        self.merge_word_pieces = merge_word_pieces
        self.step_heatmaps = step_heatmaps
        self.training_log = TrainingLog()
        self.report_path: Optional[str] = None
        self._directory: Optional[str] = None
        self._seen: Dict[int, int] = {}
        self._trainer: Optional[Any] = None

    @staticmethod
    def audits(trainer: "pl.Trainer") -> List[ReportableAudit]:
        """The audit callbacks of ``trainer`` (whatever has the :class:`ReportableAudit` attributes)."""
        # Trainer.callbacks is set by Lightning's CallbackConnector; the Trainer class does not declare it
        return [c for c in trainer.callbacks if isinstance(c, ReportableAudit)]  # type: ignore[attr-defined]

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        # The folder is chosen on rank zero and broadcast: every process must ask. fit then test keep one folder.
        same_run = self._trainer is not None and self._trainer() is trainer and self._directory is not None
        if not same_run:
            self._directory = self.dirpath or run_report_directory(trainer)
            if trainer.is_global_zero:
                os.makedirs(self._directory, exist_ok=True)  # claims version_N before another run asks
        self._trainer = weakref.ref(trainer)
        if not self.audits(trainer):
            pl.utilities.rank_zero.rank_zero_warn(
                "AuditReport found no audit callback (AttentionAudit, ErasureAudit, "
                "AttentionBaselines, ImpermissibleAttentionMonitor) to report on."
            )

    def _refresh(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", force: bool = False, final: bool = False
    ) -> None:
        audits = self.audits(trainer)
        changed = [a for a in audits if self._seen.get(id(a)) != a.version]
        if not changed and not force:
            return
        for audit in changed:
            self._seen[id(audit)] = audit.version
        if not audits:
            return
        failure: Optional[BaseException] = None
        if trainer.is_global_zero:
            try:
                self._write(trainer, pl_module, audits, changed, final)
            except Exception as err:  # noqa: BLE001 - agreed on below, then warned about or raised on every process
                failure = err
        self._agree_on_failure(trainer, audits, failure)

    def _agree_on_failure(
        self, trainer: "pl.Trainer", audits: List[ReportableAudit], failure: Optional[BaseException]
    ) -> None:
        """Process 0 writes the report; the others learn whether it failed (a broadcast every process makes, so
        none runs on into a collective process 0 left). A failure is warned about and training goes on, or —
        when an audit callback is ``strict`` — raised on every process."""
        shared = trainer.strategy.broadcast(None if failure is None else f"{type(failure).__name__}: {failure}", src=0)
        if shared is None:
            return
        if any(getattr(audit, "strict", False) for audit in audits):
            if failure is not None:
                raise failure
            raise RuntimeError(
                f"AuditReport: writing the report failed on process 0 ({shared}); raised on every "
                "process because an audit callback is strict"
            )
        pl.utilities.rank_zero.rank_zero_warn(
            f"AuditReport: writing the report failed with {shared}; the report was not updated and training "
            "continues (pass strict=True to the audit callbacks to raise instead)."
        )

    def _write(
        self,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        audits: List[ReportableAudit],
        changed: List[ReportableAudit],
        final: bool,
    ) -> None:
        """Process 0's part of :meth:`_refresh`: example tokens, W&B tables, the page (and, ``final``, its PNGs)."""
        for audit in changed:
            if audit.latest is None:
                continue
            for example in audit.latest.examples:
                if example.tokens is None and example.maps:
                    example.tokens = audit.example_tokens(trainer, pl_module, example)
                if getattr(example, "target_token_ids", None) is not None and example.target_tokens is None:
                    example.target_tokens = audit.example_tokens(trainer, pl_module, example, target=True)
            if self.wandb:
                for logger in trainer.loggers:
                    if is_wandb_logger(logger):
                        stage = audit.latest.stage
                        prefix = audit.log_prefix if stage == "fit" else f"{stage}/{audit.log_prefix}"
                        log_audit_to_wandb(
                            logger,
                            prefix,
                            audit.latest.examples,
                            audit.latest.global_step,
                            step_heatmaps=self.step_heatmaps,
                        )
        directory = self._directory or os.path.join(trainer.default_root_dir, "xai_report")
        latest = [a.latest for a in audits if a.latest is not None]
        last = max(latest, key=lambda r: r.global_step) if latest else None
        epoch, step = (last.epoch, last.global_step) if last else (trainer.current_epoch, trainer.global_step)
        subtitle = f"{type(pl_module).__name__}, latest audit: epoch {epoch}, step {step}"
        # Heatmap PNGs are the slow part: draw them once, when the run (fit/validate/test) ends.
        self.report_path = write_report(
            audits,
            directory,
            self.filename,
            self.title,
            subtitle,
            self.max_examples,
            self.png,
            self.heatmap_pngs if final else 0,
            training=self.training_log.records,
            merge_pieces=self.merge_word_pieces,
            step_heatmaps=self.step_heatmaps,
        )
        if final and self.wandb:
            wandb_loggers = [logger for logger in trainer.loggers if is_wandb_logger(logger)]
            if wandb_loggers:
                with open(self.report_path, encoding="utf-8") as handle:
                    page = handle.read()
                for logger in wandb_loggers:
                    log_report_to_wandb(logger, page, trainer.global_step)

    def _capture(self, trainer: "pl.Trainer", epoch: int) -> None:
        exclude = [f"{a.log_prefix}/" for a in self.audits(trainer)]
        self.training_log.capture(dict(trainer.callback_metrics), epoch, trainer.global_step, exclude)

    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"training_log": self.training_log.state_dict()}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.training_log.load_state_dict(state_dict.get("training_log", {}))

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.current_epoch > 0:  # the epoch means of train/* of the epoch just ended are in callback_metrics
            self._capture(trainer, trainer.current_epoch - 1)

    def summary(self) -> str:
        """The final results table of every audit callback of the trainer (and its ``test/acc``), as text.

        ``lightning-xai``'s CLI prints the ``summary()`` of every callback that has one after testing.
        """
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is None:
            return ""
        return format_summary(final_results(trainer.callbacks, dict(trainer.callback_metrics)))

    @override
    def on_validation_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not trainer.sanity_checking:
            if trainer.state.fn == "fit":
                self._capture(trainer, trainer.current_epoch)
            self._refresh(trainer, pl_module, final=trainer.state.fn == "validate")

    @override
    def on_test_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._refresh(trainer, pl_module, final=True)

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._refresh(trainer, pl_module)

    @override
    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._capture(trainer, max(trainer.current_epoch - 1, 0))
        self._refresh(trainer, pl_module, force=True, final=True)

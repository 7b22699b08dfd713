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
import re
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_xai.lightning_compat import Callback
from lightning_xai.reporting.curves import TrainingLog, agreement_panels, audit_panels, erasure_panels, training_panels
from lightning_xai.reporting.headline import headline_html
from lightning_xai.reporting.html import (
    ReportSection,
    _esc,
    history_table_html,
    latest_table_html,
    render_report,
    token_heatmap_html,
)
from lightning_xai.reporting.interactions import pair_heatmap_html
from lightning_xai.reporting.plots import plot_heatmap, plot_histograms, plot_panels
from lightning_xai.reporting.protocol import ReportableAudit
from lightning_xai.reporting.run_directory import log_report_to_wandb, run_report_directory
from lightning_xai.reporting.step_heatmaps import MAX_STEP_EXAMPLES, step_examples, step_heatmap_html, step_words
from lightning_xai.reporting.summary import final_results, format_summary
from lightning_xai.reporting.wandb_logging import is_wandb_logger, log_audit_to_wandb
from lightning_xai.reporting.word_pieces import merge_word_pieces

__all__ = ["AuditReport", "write_report"]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _audit_figures(audit: ReportableAudit, directory: str, slug: str) -> List[Tuple[str, str, str]]:
    """The audit's PNGs over epochs: the erasure comparison (every ranking on one axis per measure), agreement
    metrics as small multiples (one axes per pair of maps), anything else one axes per group."""
    history = audit.history
    figures: List[Tuple[str, str, str]] = []
    erasure = erasure_panels(history)
    if erasure:
        path = plot_panels(
            erasure,
            os.path.join(directory, f"{slug}_erasure_comparison.png"),
            title=f"{audit.log_prefix}: erasure, attention vs random vs saliency rankings",
        )
        if path:
            figures.append(
                (
                    "Erasure over epochs: every ranking on the same axes, one axes per measure (means over "
                    "the audit subset; the per-ranking std is in the tables)",
                    path,
                    "erasure-comparison",
                )
            )
    for metric, panels in agreement_panels(history, audit.log_prefix).items():
        path = plot_panels(
            panels,
            os.path.join(directory, f"{slug}_{_slug(metric)}_over_epochs.png"),
            title=f"{audit.log_prefix}: {metric} over epochs, one pair of maps per axes",
        )
        if path:
            figures.append(
                (
                    f"{metric} over epochs, one pair per axes (mean ± std over the audit subset)",
                    path,
                    f"{slug}-{_slug(metric)}",
                )
            )
    if not figures:
        keys = list(dict.fromkeys(k for r in history for k in r["metrics"]))
        plain = [k for k in keys if "count" not in k and "bin[" not in k and not k.endswith(("/std", "/p_value"))]
        names = list(dict.fromkeys(k[: -len("/mean")] if k.endswith("/mean") else k for k in plain))
        groups: Dict[str, List[str]] = {}
        for name in names:
            groups.setdefault(name.split("/")[0], []).append(name)
        fit = [r for r in history if r.get("stage") == "fit"]
        panels = [(group, fit, members, group) for group, members in groups.items()]
        path = plot_panels(
            panels, os.path.join(directory, f"{slug}_results_over_epochs.png"), title=f"{audit.log_prefix} over epochs"
        )
        if path:
            figures.append(("Results over epochs", path, f"{slug}-over-epochs"))
    return figures


def _audit_section(
    audit: ReportableAudit,
    result: Optional[Any],
    directory: str,
    max_examples: int,
    png: bool,
    heatmap_pngs: int,
    merge_pieces: bool = False,
    step_heatmaps: int = MAX_STEP_EXAMPLES,
) -> ReportSection:
    title = f"{type(audit).__name__} ({audit.log_prefix})"
    slug = _slug(audit.log_prefix)
    parts: List[str] = []
    images: List[Tuple[str, ...]] = []
    history = audit.history
    if history:
        last = history[-1]
        parts.append(
            f'<h3>Latest audit</h3><p class="meta">stage {_esc(last["stage"])}, epoch {_esc(last["epoch"])}, '
            f"step {_esc(last['global_step'])}, split {_esc(last['split'])}, "
            f"{_esc(last['num_examples'])} examples</p>"
        )
        parts.append(latest_table_html(last["metrics"]))
        mean_keys = [k for r in history for k in r["metrics"] if k.endswith("/mean")]
        keys = list(dict.fromkeys(mean_keys)) or None
        parts.append("<details><summary>All audits</summary>" + history_table_html(history, keys) + "</details>")
    else:
        parts.append('<p class="meta">No audit has run yet.</p>')
    if png and history:
        images.extend(_audit_figures(audit, directory, slug))
    if result is not None and result.examples:
        keys = audit.histogram_keys(result.examples)
        values: Dict[str, List[float]] = {k: [e.values[k] for e in result.examples if k in e.values] for k in keys}
        if png:
            path = plot_histograms(
                values,
                os.path.join(directory, f"{slug}_histograms.png"),
                title=f"{audit.log_prefix}: per-example values (latest audit)",
            )
            if path:
                images.append(("Per-example values of the latest audit (legend: mean of each)", path))
        shown = [e for e in result.examples if e.maps][:max_examples]
        with_steps = {id(e) for e in step_examples(shown, step_heatmaps)}
        if shown:
            parts.append("<h3>Token heatmaps (latest audit)</h3>")
        for number, example in enumerate(shown):
            tokens = pieces = example.tokens or [str(i) for i in example.token_ids]
            maps = {k: [float(v) for v in scores] for k, scores in example.maps.items()}
            if merge_pieces:
                tokens, maps = merge_word_pieces(tokens, maps)
            target = getattr(example, "target_tokens", None)  # a generator's: its target, not a class
            what = (
                f"target “{' '.join(target)}”" if target else f"label {example.label}, prediction {example.prediction}"
            )
            caption = f"split {example.split}, {what} (p = {example.probability:.3f}), {len(tokens)} " + (
                "words (word pieces merged, scores summed)" if merge_pieces else "tokens"
            )
            parts.append(token_heatmap_html(tokens, maps, title=f"Example {example.index}", caption=caption))
            if getattr(example, "interactions", None) is not None:  # Integrated Hessians' strongest pairs
                parts.append(
                    pair_heatmap_html(
                        pieces,
                        example.interactions,
                        anchor=f"pairs-{slug}-{example.split}-{example.index}",
                        title=f"Example {example.index}: strongest token pairs (Integrated Hessians)",
                    )
                )
            if id(example) in with_steps:  # a generator's maps per target step
                parts.append(
                    step_heatmap_html(
                        *step_words(example),
                        example.step_maps,
                        merge_pieces=merge_pieces,
                        title=f"Example {example.index}: source tokens × target tokens",
                        anchor=f"steps-{slug}-{example.split}-{example.index}",
                    )
                )
            if png and number < heatmap_pngs:
                plot_heatmap(
                    tokens,
                    maps,
                    os.path.join(directory, f"{slug}_heatmap_{example.split}_{example.index}.png"),
                    title=f"{example.split} example {example.index}",
                )
    return ReportSection(title, "".join(parts), images)


def _lead_sections(
    audits: Sequence[ReportableAudit], training: Sequence[Dict[str, Any]], directory: str, png: bool
) -> List[ReportSection]:
    lead = [ReportSection("", headline_html(audits, training))]
    panels = training_panels(training) + audit_panels(audits)
    path = (
        plot_panels(
            panels,
            os.path.join(directory, "training_and_audits.png"),
            columns=4,
            title="Training metrics and audit metrics, epoch by epoch",
        )
        if png and panels
        else None
    )
    if path:
        body = (
            '<p class="meta">The training\'s own logged metrics (first panels: the value in '
            "trainer.callback_metrics at each epoch's end — a metric logged per step shows its last step) "
            "beside the audits' headline metrics, on the same integer epoch axis.</p>"
        )
    else:
        absent = [
            what
            for what, ok in (
                ("training metrics", training_panels(training)),
                ("audits over epochs", audit_panels(audits)),
            )
            if not ok
        ]
        body = (
            '<p class="meta">No curve yet'
            + (f" (absent: {_esc(', '.join(absent))})" if absent else "")
            + ("" if png else " — PNGs are turned off")
            + ".</p>"
        )
    lead.append(
        ReportSection(
            "Training and audits over epochs",
            body,
            [("Training and audit metrics over epochs", path)] if path else [],
            anchor="curves",
        )
    )
    return lead


def write_report(
    audits: Sequence[ReportableAudit],
    directory: str,
    filename: str = "report.html",
    title: str = "lightning_xai audit report",
    subtitle: Optional[str] = None,
    max_examples: int = 8,
    png: bool = True,
    heatmap_pngs: int = 4,
    training: Sequence[Dict[str, Any]] = (),
    merge_pieces: bool = False,
    step_heatmaps: int = MAX_STEP_EXAMPLES,
) -> str:
    """Write ``report.html`` (and the PNGs it embeds) for ``audits`` into ``directory``; return its path.

    The page opens with the headline (what the latest audits say, in words) and the curves of ``training``
    (records of the training's logged metrics, see :class:`~lightning_xai.reporting.curves.TrainingLog`) beside
    the audit metrics; then one section per audit. Tokens of the examples must already be filled in
    (:class:`AuditReport` does it); ``merge_pieces`` shows HF word pieces as words (scores summed);
    ``step_heatmaps`` generator examples per audit also show their source × target heatmaps.

    Example:
        >>> import tempfile
        >>> class Audit:
        ...     log_prefix, version, latest = "agreement", 1, None
        ...     history = [{"stage": "fit", "epoch": 0, "global_step": 5, "split": "val", "num_examples": 4,
        ...                 "metrics": {"kendall_tau/attention_vs_gradient/mean": 0.3}}]
        ...     def histogram_keys(self, examples): return []
        ...     def example_tokens(self, trainer, module, example): return []
        >>> page = open(write_report([Audit()], tempfile.mkdtemp(), png=False), encoding="utf-8").read()
        >>> 'id="headline"' in page and "gradient 0.300" in page
        True
    """
    os.makedirs(directory, exist_ok=True)
    lead = _lead_sections(audits, training, directory, png)
    sections = [
        _audit_section(a, a.latest, directory, max_examples, png, heatmap_pngs, merge_pieces, step_heatmaps)
        for a in audits
    ]
    page = render_report(title, sections, subtitle=subtitle, lead=lead)
    path = os.path.join(directory, filename)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(page)
    os.replace(tmp, path)
    return path


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

"""``AuditReport``: turn the audit callbacks' results into a report, PNGs and W&B tables as training goes.

Add it next to the audit callbacks. After every audit it (on rank zero only)

* writes ``report.html`` (self-contained: no CDN, no script; legend and colour scale; all text escaped) and
  matplotlib PNGs — each metric over epochs, per-example histograms, token heatmaps — into ``dirpath``
  (default ``<trainer.log_dir>/xai_report``), whatever the logger (or none);
* with a ``WandbLogger``, logs a ``wandb.Table`` of the audited examples, HTML token-heatmap panels (one per
  method and all maps side by side) and histograms of the per-example values.
"""
from __future__ import annotations

import os
import re
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_xai.reporting.html import (ReportSection, _esc, _fmt, history_table_html, render_report,
                                          token_heatmap_html)
from lightning_xai.reporting.plots import plot_heatmap, plot_histograms, plot_history
from lightning_xai.reporting.protocol import ReportableAudit
from lightning_xai.reporting.summary import final_results, format_summary
from lightning_xai.reporting.wandb_logging import is_wandb_logger, log_audit_to_wandb

__all__ = ["AuditReport", "write_report"]

_STATS = ("mean", "std", "significant_fraction")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def _split_stat(key: str) -> Tuple[str, str]:
    head, _, tail = key.rpartition("/")
    return (head, tail) if head and tail in _STATS else (key, "value")


def _latest_table(metrics: Dict[str, float]) -> str:
    rows: Dict[str, Dict[str, float]] = {}
    for key, value in metrics.items():
        name, stat = _split_stat(key)
        rows.setdefault(name, {})[stat] = value
    columns = [c for c in (*_STATS, "value") if any(c in r for r in rows.values())]
    head = "".join(f"<th>{_esc(c.replace('_', ' '))}</th>" for c in ["result", *columns])
    body = "".join(
        "<tr><td>" + _esc(name) + "</td>" + "".join(
            f'<td class="num">{_fmt(r[c]) if c in r else ""}</td>' for c in columns) + "</tr>"
        for name, r in rows.items())
    return f"<table><tr>{head}</tr>{body}</table>"


def _plot_groups(history: Sequence[Dict[str, Any]]) -> Dict[str, List[str]]:
    keys: List[str] = []
    for record in history:
        keys.extend(k for k in record["metrics"] if k not in keys)
    means = [k[: -len("/mean")] for k in keys if k.endswith("/mean")]
    if means:
        groups: Dict[str, List[str]] = {}
        for name in means:
            groups.setdefault(name.split("/")[0], []).append(name)
        return groups
    plain = [k for k in keys if "count" not in k and "bin[" not in k]
    return {"results": plain} if plain else {}


def _audit_section(audit: ReportableAudit, result: Optional[Any], directory: str,
                   max_examples: int, png: bool, heatmap_pngs: int) -> ReportSection:
    title = f"{type(audit).__name__} ({audit.log_prefix})"
    slug = _slug(audit.log_prefix)
    parts: List[str] = []
    images: List[Tuple[str, str]] = []
    history = audit.history
    if history:
        last = history[-1]
        parts.append(f'<h3>Latest audit</h3><p class="meta">stage {_esc(last["stage"])}, epoch {_esc(last["epoch"])}, '
                     f'step {_esc(last["global_step"])}, split {_esc(last["split"])}, '
                     f'{_esc(last["num_examples"])} examples</p>')
        parts.append(_latest_table(last["metrics"]))
        mean_keys = [k for r in history for k in r["metrics"] if k.endswith("/mean")]
        keys = list(dict.fromkeys(mean_keys)) or None
        parts.append("<details><summary>All audits</summary>" + history_table_html(history, keys) + "</details>")
    else:
        parts.append('<p class="meta">No audit has run yet.</p>')
    if png and history:
        for group, names in _plot_groups(history).items():
            path = plot_history(history, names, os.path.join(directory, f"{slug}_{_slug(group)}_over_epochs.png"),
                                title=f"{audit.log_prefix}: {group} over epochs", ylabel=group)
            if path:
                images.append((f"{group} over epochs (mean ± std over the audit subset)", path))
    if result is not None and result.examples:
        keys = audit.histogram_keys(result.examples)
        values: Dict[str, List[float]] = {k: [e.values[k] for e in result.examples if k in e.values] for k in keys}
        if png:
            path = plot_histograms(values, os.path.join(directory, f"{slug}_histograms.png"),
                                   title=f"{audit.log_prefix}: per-example values (latest audit)")
            if path:
                images.append(("Per-example values of the latest audit (legend: mean of each)", path))
        shown = [e for e in result.examples if e.maps][:max_examples]
        if shown:
            parts.append("<h3>Token heatmaps (latest audit)</h3>")
        for number, example in enumerate(shown):
            tokens = example.tokens or [str(i) for i in example.token_ids]
            caption = (f"split {example.split}, label {example.label}, prediction {example.prediction} "
                       f"(p = {example.probability:.3f})")
            parts.append(token_heatmap_html(tokens, example.maps, title=f"Example {example.index}", caption=caption))
            if png and number < heatmap_pngs:
                plot_heatmap(tokens, example.maps,
                             os.path.join(directory, f"{slug}_heatmap_{example.split}_{example.index}.png"),
                             title=f"{example.split} example {example.index}")
    return ReportSection(title, "".join(parts), images)


def write_report(audits: Sequence[ReportableAudit], directory: str, filename: str = "report.html",
                 title: str = "lightning_xai audit report", subtitle: Optional[str] = None,
                 max_examples: int = 8, png: bool = True, heatmap_pngs: int = 4) -> str:
    """Write ``report.html`` (and the PNGs it embeds) for ``audits`` into ``directory``; return its path.

    Tokens of the examples must already be filled in (:class:`AuditReport` does it).
    """
    os.makedirs(directory, exist_ok=True)
    sections = [_audit_section(a, a.latest, directory, max_examples, png, heatmap_pngs) for a in audits]
    page = render_report(title, sections, subtitle=subtitle)
    path = os.path.join(directory, filename)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(page)
    os.replace(tmp, path)
    return path


class AuditReport(Callback):
    """Write the audit report (HTML + PNGs) and W&B tables/panels after every audit of the audit callbacks.

    Args:
        dirpath: where ``report.html`` and the PNGs go (default ``<trainer.log_dir>/xai_report``).
        filename: the report's file name.
        png: also write matplotlib PNGs (embedded in the report as ``data:`` URIs).
        wandb: log tables, HTML panels and histograms when the trainer has a ``WandbLogger``.
        max_examples: HTML heatmaps per audit callback.
        heatmap_pngs: PNG heatmaps per audit callback, drawn when fit/validate/test ends.
        title: the report's heading.

    Example:
        >>> import pytorch_lightning as pl
        >>> from lightning_xai.callbacks import AttentionAudit
        >>> trainer = pl.Trainer(callbacks=[AttentionAudit(), AuditReport()], logger=False,
        ...                      enable_progress_bar=False, enable_model_summary=False)
        >>> [type(c).__name__ for c in trainer.callbacks][:2]
        ['AttentionAudit', 'AuditReport']
    """

    def __init__(self, dirpath: Optional[str] = None, filename: str = "report.html", png: bool = True,
                 wandb: bool = True, max_examples: int = 8, heatmap_pngs: int = 4, title: str = "lightning_xai audit report") -> None:
        super().__init__()
        if not filename.endswith(".html") or os.sep in filename:
            raise MisconfigurationException(f"AuditReport(filename) must be a file name ending in .html, got {filename!r}.")
        if not isinstance(max_examples, int) or max_examples < 0:
            raise MisconfigurationException(f"AuditReport(max_examples) must be an int >= 0, got {max_examples!r}.")
        self.dirpath = dirpath
        self.filename = filename
        self.png = png
        self.wandb = wandb
        self.max_examples = max_examples
        self.heatmap_pngs = heatmap_pngs
        self.title = title
        self.report_path: Optional[str] = None
        self._directory: Optional[str] = None
        self._seen: Dict[int, int] = {}
        self._trainer: Optional[Any] = None

    @staticmethod
    def audits(trainer: "pl.Trainer") -> List[ReportableAudit]:
        """The audit callbacks of ``trainer`` (whatever has the :class:`ReportableAudit` attributes)."""
        return [c for c in trainer.callbacks if isinstance(c, ReportableAudit)]

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        # trainer.log_dir broadcasts from rank zero: every process must ask.
        base = self.dirpath or os.path.join(trainer.log_dir or trainer.default_root_dir, "xai_report")
        self._directory = base
        self._trainer = weakref.ref(trainer)
        if not self.audits(trainer):
            pl.utilities.rank_zero.rank_zero_warn("AuditReport found no audit callback (AttentionAudit, ErasureAudit, "
                                                  "AttentionBaselines, ImpermissibleAttentionMonitor) to report on.")

    def _refresh(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", force: bool = False,
                 final: bool = False) -> None:
        audits = self.audits(trainer)
        changed = [a for a in audits if self._seen.get(id(a)) != a.version]
        if not changed and not force:
            return
        for audit in changed:
            self._seen[id(audit)] = audit.version
        if not trainer.is_global_zero or not audits:
            return
        for audit in changed:
            if audit.latest is None:
                continue
            for example in audit.latest.examples:
                if example.tokens is None and example.maps:
                    example.tokens = audit.example_tokens(trainer, pl_module, example)
            if self.wandb:
                for logger in trainer.loggers:
                    if is_wandb_logger(logger):
                        stage = audit.latest.stage
                        prefix = audit.log_prefix if stage == "fit" else f"{stage}/{audit.log_prefix}"
                        log_audit_to_wandb(logger, prefix, audit.latest.examples, audit.latest.global_step)
        directory = self._directory or os.path.join(trainer.default_root_dir, "xai_report")
        latest = [a.latest for a in audits if getattr(a, "latest", None) is not None]
        last = max(latest, key=lambda r: r.global_step) if latest else None
        epoch, step = (last.epoch, last.global_step) if last else (trainer.current_epoch, trainer.global_step)
        subtitle = f"{type(pl_module).__name__}, latest audit: epoch {epoch}, step {step}"
        # Heatmap PNGs are the slow part: draw them once, when the run (fit/validate/test) ends.
        self.report_path = write_report(audits, directory, self.filename, self.title, subtitle,
                                        self.max_examples, self.png, self.heatmap_pngs if final else 0)

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
            self._refresh(trainer, pl_module, final=trainer.state.fn == "validate")

    @override
    def on_test_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._refresh(trainer, pl_module, final=True)

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._refresh(trainer, pl_module)

    @override
    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._refresh(trainer, pl_module, force=True, final=True)

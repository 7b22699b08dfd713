"""The report page: ``write_report`` lays out the headline, the training and audit curves and one section per audit
(figures, history and latest tables, token heatmaps, a generator's source × target heatmaps) into one
self-contained ``report.html`` with its PNGs. :class:`~lightning_xai.reporting.report.AuditReport` calls it after
every audit; it can also be called on any :class:`~lightning_xai.reporting.protocol.ReportableAudit`.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lightning_xai.reporting.curves import agreement_panels, audit_panels, erasure_panels, training_panels
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
from lightning_xai.reporting.step_heatmaps import MAX_STEP_EXAMPLES, step_examples, step_heatmap_html, step_words
from lightning_xai.reporting.word_pieces import merge_word_pieces

__all__ = ["write_report"]


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

"""Weights & Biases output of audits — the only place in lightning_xai that imports ``wandb`` (lazily).

With a ``WandbLogger`` an audit is logged as: a ``wandb.Table`` of audited examples (tokens, label, prediction,
probability, per-method token scores — ``scores/<method>``, one list of numbers per row, one per token — and
per-example values), an HTML token-heatmap panel per method and one with
all maps side by side (``wandb.Html``), and a histogram of every per-example value (``wandb.Histogram``). A
generator's audit also logs a few examples' step maps: a ``wandb.Table`` with one row per source × target cell
(``index``, ``map``, ``step``, ``target_token``, ``source_position``, ``source_token``, ``score``) and their source
tokens × target tokens heatmaps (``wandb.Html``), as the report shows them.
Nothing here runs — and ``wandb`` is never imported — without such a logger.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

from lightning_xai.reporting.html import legend_html, token_heatmap_html
from lightning_xai.reporting.step_heatmaps import (
    MAX_STEP_EXAMPLES,
    step_examples,
    step_heatmap_html,
    step_table_rows,
    step_words,
)

__all__ = ["STEP_COLUMNS", "is_wandb_logger", "wandb_payload", "log_audit_to_wandb"]


def is_wandb_logger(logger: Any) -> bool:
    """True for Lightning's ``WandbLogger`` (checked by class name, so W&B need not be installed).

    Example:
        >>> is_wandb_logger(object())
        False
    """
    return any(cls.__name__ == "WandbLogger" for cls in type(logger).__mro__)


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as err:  # pragma: no cover - exercised only without wandb installed
        raise ImportError(
            "Logging audit tables to W&B needs the wandb package: pip install 'lightning-xai[wandb]'."
        ) from err
    return wandb


def _panel(title: str, examples: Sequence[Any], methods: Sequence[str]) -> str:
    parts = [f"<html><head><meta charset='utf-8'></head><body style='font-family:sans-serif'>{legend_html()}"]
    for ex in examples:
        maps = {m: ex.maps[m] for m in methods if m in ex.maps}
        if maps:
            caption = f"label {ex.label}, prediction {ex.prediction} (p={ex.probability:.3f})"
            parts.append(
                token_heatmap_html(ex.tokens or [], maps, title=f"{title} — example {ex.index}", caption=caption)
            )
    parts.append("</body></html>")
    return "".join(parts)


#: the columns of a generator's step-map table: one row per source × target cell of an example's map
STEP_COLUMNS = ["index", "map", "step", "target_token", "source_position", "source_token", "score"]


def wandb_payload(
    prefix: str,
    examples: Sequence[Any],
    wandb_module: Any,
    panel_methods: Optional[Sequence[str]] = None,
    step_heatmaps: int = MAX_STEP_EXAMPLES,
) -> Dict[str, Any]:
    """The W&B objects of one audit: ``{prefix}/examples`` table, ``{prefix}/heatmaps`` (all maps side by side),
    ``{prefix}/heatmap/<method>`` panels and ``{prefix}/hist/<value>`` histograms; for the first ``step_heatmaps``
    examples with step maps (a generator's), ``{prefix}/step_maps`` (a table of :data:`STEP_COLUMNS`) and
    ``{prefix}/step_heatmaps`` (their source tokens × target tokens heatmaps).

    ``examples`` are :class:`~lightning_xai.callbacks.AuditExample` with ``tokens`` filled in.
    """
    wandb = wandb_module
    detailed = [e for e in examples if e.maps]
    methods: List[str] = []
    for e in detailed:
        methods.extend(m for m in e.maps if m not in methods)
    value_names: List[str] = []
    for e in examples:
        value_names.extend(k for k in e.values if k not in value_names and not k.endswith("/p_value"))
    columns = ["index", "tokens", "label", "prediction", "probability"] + [f"scores/{m}" for m in methods] + value_names
    table = wandb.Table(columns=columns)
    for e in detailed:
        row = [e.index, " ".join(e.tokens or []), e.label, e.prediction, e.probability]
        row += [[float(s) for s in e.maps.get(m, [])] for m in methods]  # numbers (a list per cell), not text
        row += [e.values.get(k) for k in value_names]
        table.add_data(*row)
    payload: Dict[str, Any] = {f"{prefix}/examples": table}
    if detailed:
        payload[f"{prefix}/heatmaps"] = wandb.Html(_panel("all maps", detailed, methods), inject=False)
        for method in panel_methods or methods:
            if any(method in e.maps for e in detailed):
                payload[f"{prefix}/heatmap/{method}"] = wandb.Html(_panel(method, detailed, [method]), inject=False)
    stepped = step_examples(detailed, step_heatmaps)
    if stepped:
        payload[f"{prefix}/step_maps"] = wandb.Table(
            columns=STEP_COLUMNS, data=[row for e in stepped for row in step_table_rows(e)]
        )
        panels = "".join(step_heatmap_html(*step_words(e), e.step_maps, title=f"example {e.index}") for e in stepped)
        payload[f"{prefix}/step_heatmaps"] = wandb.Html(
            f"<html><head><meta charset='utf-8'></head><body style='font-family:sans-serif'>{panels}</body></html>",
            inject=False,
        )
    for name in value_names:
        vals = [e.values[name] for e in examples if name in e.values and not math.isnan(e.values[name])]
        if vals:
            payload[f"{prefix}/hist/{name}"] = wandb.Histogram(vals)
    return payload


def log_audit_to_wandb(
    logger: Any, prefix: str, examples: Sequence[Any], step: int, step_heatmaps: int = MAX_STEP_EXAMPLES
) -> Dict[str, Any]:
    """Log one audit's table, heatmap panels and histograms (and a generator's step maps, see
    :func:`wandb_payload`) to a ``WandbLogger``'s run (call on rank zero)."""
    wandb = _import_wandb()
    payload = wandb_payload(prefix, examples, wandb, step_heatmaps=step_heatmaps)
    logger.experiment.log(dict(payload, **{"trainer/global_step": step}))
    return payload

"""Matplotlib PNGs of audits: a metric over epochs (mean ± std band), per-example histograms, token heatmaps.

Figures are drawn with the Agg canvas directly (no ``pyplot`` global state), so they work headless and in threads.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["Panel", "plot_history", "plot_histograms", "plot_heatmap", "plot_panels"]


def _label(text: Any) -> str:
    """Matplotlib reads ``$...$`` as mathtext; show user text literally."""
    return str(text).replace("$", r"\$")


def _save(fig: Figure, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100)
    return path


def plot_history(
    history: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    path: str,
    title: str = "Agreement over epochs",
    ylabel: str = "value",
) -> Optional[str]:
    """Plot ``<name>/mean`` (with a ``<name>/std`` band when logged) against the epoch for each name.

    Only ``fit`` records are plotted. Returns the path, or ``None`` when there is nothing to plot.

    Example:
        >>> import tempfile, os
        >>> h = [{"stage": "fit", "epoch": e, "metrics": {"tau/mean": 0.1 * e, "tau/std": 0.05}} for e in range(3)]
        >>> out = plot_history(h, ["tau"], os.path.join(tempfile.mkdtemp(), "h.png"))
        >>> os.path.getsize(out) > 1000
        True
    """
    records = [r for r in history if r.get("stage") == "fit"]
    if not records or not names:
        return None
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    plotted = sum(_draw_series(ax, records, name) for name in names)
    if not plotted:
        return None
    _style_axes(ax, title, ylabel)
    return _save(fig, path)


def _draw_series(
    ax: Any, records: Sequence[Mapping[str, Any]], name: str, label: Optional[str] = None, band: bool = True
) -> bool:
    """``<name>/mean`` (or ``name``) against the epoch, with a ``<name>/std`` band; False when nothing to draw."""
    points = [
        (r["epoch"], r["metrics"].get(f"{name}/mean", r["metrics"].get(name)), r["metrics"].get(f"{name}/std"))
        for r in records
    ]
    points = [p for p in points if isinstance(p[1], (int, float)) and not math.isnan(p[1])]
    if not points:
        return False
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    ax.plot(x, y, marker="o", label=_label(label or name))
    std = [p[2] for p in points]
    if band and all(s is not None and not math.isnan(s) for s in std):
        s = np.array(std, dtype=float)
        ax.fill_between(x, y - s, y + s, alpha=0.15)
    return True


def _style_axes(ax: Any, title: str, ylabel: str, legend: bool = True) -> None:
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(_label(ylabel))
    ax.set_title(_label(title), fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7, loc="best")


#: one small multiple: (title, records with ``epoch`` and ``metrics``, series names, y label)
Panel = Tuple[str, Sequence[Mapping[str, Any]], Sequence[str], str]


def plot_panels(panels: Sequence[Panel], path: str, title: str = "", columns: int = 3) -> Optional[str]:
    """Small multiples on one shared, integer epoch axis: one axes per panel, every series of a panel on it.

    A panel with one series draws its ±std band; with several, the bands are left out so they do not pile up
    (the per-series tables carry the std). Returns the path, or ``None`` when no panel has a point.

    Example:
        >>> import tempfile, os
        >>> h = [{"epoch": e, "metrics": {"a/mean": 0.1 * e, "a/std": 0.05, "b": 1.0 - 0.1 * e}} for e in range(3)]
        >>> out = plot_panels([("a", h, ["a"], "tau"), ("a vs b", h, ["a", "b"], "value")],
        ...                   os.path.join(tempfile.mkdtemp(), "p.png"))
        >>> os.path.getsize(out) > 1000
        True
    """
    drawable = [p for p in panels if any(_has_points(p[1], name) for name in p[2])]
    if not drawable:
        return None
    columns = max(1, min(columns, len(drawable)))
    rows = math.ceil(len(drawable) / columns)
    fig = Figure(figsize=(4.4 * columns, 3.0 * rows + (0.4 if title else 0.0)), layout="constrained")
    axes = fig.subplots(rows, columns, sharex=True, squeeze=False).flatten()
    for ax, (panel_title, records, names, ylabel) in zip(axes, drawable):
        for name in names:
            _draw_series(ax, records, name, band=len(names) == 1)
        _style_axes(ax, panel_title, ylabel, legend=len(names) > 1)
        ax.xaxis.set_tick_params(labelbottom=True)
    for ax in axes[len(drawable) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(_label(title), fontsize=11)
    return _save(fig, path)


def _has_points(records: Sequence[Mapping[str, Any]], name: str) -> bool:
    return any(
        isinstance(v, (int, float)) and not math.isnan(v)
        for v in (r["metrics"].get(f"{name}/mean", r["metrics"].get(name)) for r in records)
    )


def plot_histograms(
    values: Mapping[str, Sequence[float]], path: str, title: str = "Per-example values", bins: int = 20
) -> Optional[str]:
    """Overlaid step histograms of per-example values, one line per name (NaNs dropped), on one axes.

    Example:
        >>> import tempfile, os
        >>> out = plot_histograms({"tau": [0.1, 0.3, 0.2, float("nan")]}, os.path.join(tempfile.mkdtemp(), "h.png"))
        >>> os.path.exists(out)
        True
    """
    clean = {k: [v for v in vs if v is not None and not math.isnan(v)] for k, vs in values.items()}
    clean = {k: v for k, v in clean.items() if v}
    if not clean:
        return None
    low = min(min(v) for v in clean.values())
    high = max(max(v) for v in clean.values())
    edges = np.linspace(low, high if high > low else low + 1.0, bins + 1)
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for name, vals in clean.items():
        # matplotlib's stub types bins as int | Sequence[float] | str; hist documents (and takes) an array of edges
        ax.hist(
            vals,
            bins=edges,
            histtype="step",
            linewidth=1.5,  # type: ignore[arg-type]
            label=f"{_label(name)} (mean {float(np.mean(vals)):.3f})",
        )
    ax.set_xlabel("per-example value")
    ax.set_ylabel("examples")
    ax.set_title(_label(title), fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_heatmap(
    tokens: Sequence[str], maps: Mapping[str, Sequence[float]], path: str, title: str = ""
) -> Optional[str]:
    """A token × map heatmap (each map scaled to its largest |score|; blue positive, red negative).

    Example:
        >>> import tempfile, os
        >>> out = plot_heatmap(["a", "b"], {"attention": [0.3, 0.7], "gradient": [-1.0, 2.0]},
        ...                    os.path.join(tempfile.mkdtemp(), "m.png"))
        >>> os.path.exists(out)
        True
    """
    if not tokens or not maps:
        return None
    rows = []
    for scores in maps.values():
        arr = np.array([float(s) for s in scores], dtype=float)
        if arr.shape[0] != len(tokens):
            raise ValueError(f"a map has {arr.shape[0]} scores for {len(tokens)} tokens.")
        scale = np.nanmax(np.abs(arr)) if np.isfinite(arr).any() else 0.0
        rows.append(arr / scale if scale > 0 else arr)
    data = np.vstack(rows)
    fig = Figure(figsize=(max(4.0, 0.45 * len(tokens) + 1.5), 0.45 * len(rows) + 1.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(data, cmap="RdBu", norm=TwoSlopeNorm(vcenter=0.0, vmin=-1.0, vmax=1.0), aspect="auto")
    ax.set_yticks(range(len(rows)), labels=[_label(k) for k in maps], fontsize=8)
    ax.set_xticks(range(len(tokens)), labels=[_label(t) for t in tokens], rotation=60, ha="right", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01, label="score / max |score|")
    if title:
        ax.set_title(_label(title), fontsize=9)
    return _save(fig, path)

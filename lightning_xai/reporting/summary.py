"""The final results table of an audited run, built from the audit callbacks' histories.

Example (what ``lightning-xai fit`` prints at the end of the demo)::

    quantity                                          value                        from
    test accuracy                                     0.8125
    Kendall τ attention ↔ grad_x_input                0.312 ± 0.241 (sig. 0.38)    test, epoch 7
    ...
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any, Iterable, List, Mapping, Optional, Sequence, TextIO, Tuple

__all__ = ["final_results", "format_summary", "print_summary", "pick_record", "render_cell"]

_STAGE_ORDER = ("test", "validate", "fit")


def pick_record(
    history: Sequence[Mapping[str, Any]], stages: Sequence[str] = _STAGE_ORDER
) -> Optional[Mapping[str, Any]]:
    """The latest record of the first stage in ``stages`` that has one (test beats validate beats fit).

    Example:
        >>> h = [{"stage": "fit", "epoch": 0}, {"stage": "test", "epoch": 1}, {"stage": "fit", "epoch": 1}]
        >>> pick_record(h)["stage"]
        'test'
    """
    for stage in stages:
        records = [r for r in history if r.get("stage") == stage]
        if records:
            return records[-1]
    return None


def _num(value: Optional[float], digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if value != 0 and abs(value) < 10**-digits:
        return f"{value:.2e}"
    return f"{value:.{digits}f}"


def _mean_std(metrics: Mapping[str, float], key: str) -> str:
    text = f"{_num(metrics.get(f'{key}/mean'))} ± {_num(metrics.get(f'{key}/std'))}"
    if f"{key}/significant_fraction" in metrics:
        text += f" (sig. {_num(metrics[f'{key}/significant_fraction'], 2)})"
    return text


_FIELD = re.compile(r"\{([^{}]+):([^{}:]+)\}")


def render_cell(template: str, metrics: Mapping[str, float]) -> str:
    """Fill the ``{key:style}`` fields of a summary-row template from ``metrics``.

    Styles: ``mean_std`` (``key`` names a prefix: ``key/mean ± key/std``, plus ``(sig. …)`` when
    ``key/significant_fraction`` exists), ``num`` / ``num2`` / ``num4`` (3, 2 or 4 decimals, tiny values in
    scientific notation, ``n/a`` when missing or NaN), ``int``, or any Python format spec such as ``+.3f``.

    Example:
        >>> m = {"tau/mean": 0.35, "tau/std": 0.2, "tau/significant_fraction": 0.41, "acc": 0.8, "delta": -0.02}
        >>> render_cell("{tau:mean_std}", m)
        '0.350 ± 0.200 (sig. 0.41)'
        >>> render_cell("{acc:num} (Δ {delta:+.3f}, n={n:int})", dict(m, n=8.0))
        '0.800 (Δ -0.020, n=8)'
    """

    def fill(match: "re.Match[str]") -> str:
        key, style = match.group(1), match.group(2)
        if style == "mean_std":
            return _mean_std(metrics, key)
        value = metrics.get(key)
        if style.startswith("num"):
            return _num(value, int(style[3:] or 3))
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        return str(int(value)) if style == "int" else format(value, style)

    return _FIELD.sub(fill, template)


def _source(record: Mapping[str, Any]) -> str:
    return f"{record['stage']}, epoch {record['epoch']}, n={record.get('num_examples', '?')}"


def final_results(
    callbacks: Iterable[Any], test_metrics: Optional[Mapping[str, Any]] = None, full: bool = False
) -> List[Tuple[str, str, str]]:
    """Rows ``(quantity, value, source)`` of the final table.

    Args:
        callbacks: the trainer's callbacks (non-audit ones are ignored).
        test_metrics: e.g. ``trainer.callback_metrics`` after ``trainer.test`` (``test/acc`` is shown).
        full: every agreement metric of every pair (default: the first metric, Kendall τ, as J&W report) and the
            AOPC rows of the erasure audit.

    For each audit callback the latest ``test`` record is used (else ``validate``, else ``fit``). An audit
    chooses its rows with a ``summary_rows(metrics, full)`` method returning ``(label, template)`` pairs (see
    :func:`render_cell`); one without it gets a ``mean ± std`` row per ``.../mean`` key.
    """
    rows: List[Tuple[str, str, str]] = []
    if test_metrics:
        for key in ("test/acc", "test/f1"):
            if key in test_metrics:
                value = test_metrics[key]
                value = float(value.item() if hasattr(value, "item") else value)
                rows.append(("test accuracy" if key == "test/acc" else "test macro-F1", _num(value, 4), ""))
    for cb in callbacks:
        history = getattr(cb, "history", None)
        if not isinstance(history, list):
            continue
        record = pick_record(history)
        if record is None:
            continue
        m, src = record["metrics"], _source(record)
        describe = getattr(cb, "summary_rows", None)
        if callable(describe):
            rows.extend((label, render_cell(template, m), src) for label, template in describe(m, full))
        else:
            kind = type(cb).__name__
            rows.extend((f"{kind}: {key[:-5]}", _mean_std(m, key[:-5]), src) for key in m if key.endswith("/mean"))
    return rows


def format_summary(rows: Sequence[Tuple[str, str, str]], title: str = "lightning_xai — final results") -> str:
    """The rows as an aligned plain-text table.

    Example:
        >>> print(format_summary([("test accuracy", "0.8125", "")], title="t"))
        t
        quantity       value   from
        test accuracy  0.8125
    """
    header = ("quantity", "value", "from")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = [title]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return "\n".join(lines)


def print_summary(
    trainer_or_callbacks: Any,
    test_metrics: Optional[Mapping[str, Any]] = None,
    file: Optional[TextIO] = None,
    full: bool = False,
) -> str:
    """Print (on rank zero) and return the final results table.

    Args:
        trainer_or_callbacks: a ``Trainer`` (its callbacks and, unless ``test_metrics`` is given, its
            ``callback_metrics``) or a list of callbacks.
        test_metrics: metrics holding ``test/acc`` (e.g. ``trainer.test(...)[0]``).
        file: where to print (default ``sys.stdout``).
        full: see :func:`final_results`.
    """
    callbacks = getattr(trainer_or_callbacks, "callbacks", trainer_or_callbacks)
    if test_metrics is None and hasattr(trainer_or_callbacks, "callback_metrics"):
        test_metrics = dict(trainer_or_callbacks.callback_metrics)
    text = format_summary(final_results(callbacks, test_metrics, full=full))
    if getattr(trainer_or_callbacks, "is_global_zero", True):
        print(text, file=file or sys.stdout)
    return text

"""The one registry of agreement metrics between two token maps, by name (used by ``AttentionAudit``).

An agreement metric is a function ``fn(preds, target, mask, **options)`` of two ``[B, T]`` maps over the real
tokens ``mask`` that returns per-instance values ``[B]`` (NaN where undefined) — or ``(values, p_values)`` when
registered with ``p_value=True``. Callbacks average the values with :class:`~lightning_xai.metrics.ValueMean`
(the torchmetrics :class:`~lightning_xai.metrics.InstanceMeanMetric`, so DDP sync comes from torchmetrics): a
new metric needs no class of its own.

Adding one touches at most two files: the function (e.g. in :mod:`lightning_xai.metrics.functional.agreement`)
and a :func:`register_agreement_metric` line below (or the call in your own code).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence

from lightning_xai.metrics.functional.agreement import (
    jensen_shannon,
    kendall_tau,
    pearson,
    spearman,
    topk_kendall_tau,
    topk_overlap,
)

__all__ = [
    "AGREEMENT_ALIASES",
    "AGREEMENT_METRICS",
    "AgreementMetric",
    "METRIC_LABELS",
    "metric_label",
    "register_agreement_metric",
    "resolve_agreement_metric",
]


class AgreementMetric(NamedTuple):
    """A registered agreement metric: its function and whether it returns ``(value, p_value)``."""

    function: Callable[..., Any]
    p_value: bool


#: name -> (function(preds, target, mask, **options), whether it returns ``(value, p_value)``)
AGREEMENT_METRICS: Dict[str, AgreementMetric] = {}
#: other accepted spellings -> registered name
AGREEMENT_ALIASES: Dict[str, str] = {}
#: metric name -> its label in summaries, headlines and tables (e.g. ``"Kendall τ"``); see :func:`metric_label`
METRIC_LABELS: Dict[str, str] = {}


def register_agreement_metric(
    name: str,
    function: Callable[..., Any],
    *,
    p_value: bool = False,
    aliases: Sequence[str] = (),
    replace: bool = False,
    label: Optional[str] = None,
) -> AgreementMetric:
    """Make ``name`` (and ``aliases``) usable wherever agreement metrics are chosen by name.

    ``label`` is how summaries, the report's headline and final tables name it (default: ``name``).

    Raises:
        ValueError: ``name`` or an alias is taken (pass ``replace=True`` to redefine ``name``).

    Example:
        >>> import torch
        >>> def l1(preds, target, mask):
        ...     return ((preds - target).abs() * mask).sum(-1)
        >>> register_agreement_metric("l1_distance", l1).p_value
        False
        >>> "l1_distance" in AGREEMENT_METRICS
        True
        >>> _ = AGREEMENT_METRICS.pop("l1_distance")
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"An agreement metric's name must be a non-empty string without '/', got {name!r}.")
    taken = [
        n
        for n in (name, *aliases)
        if n in AGREEMENT_ALIASES or (n in AGREEMENT_METRICS and not (replace and n == name))
    ]
    if taken:
        raise ValueError(
            f"Agreement metric name(s) {taken} already registered; pick another name or pass "
            "replace=True to redefine it."
        )
    if not callable(function):
        raise ValueError(f"Agreement metric {name!r}: function must be callable, got {function!r}.")
    if label is not None and (not isinstance(label, str) or not label):
        raise ValueError(f"Agreement metric {name!r}: label must be a non-empty string or None, got {label!r}.")
    entry = AgreementMetric(function, bool(p_value))
    AGREEMENT_METRICS[name] = entry
    AGREEMENT_ALIASES.update({alias: name for alias in aliases})
    if label is None:
        METRIC_LABELS.pop(name, None)
    else:
        METRIC_LABELS[name] = label
    return entry


def metric_label(name: str) -> str:
    """How summaries and reports name the metric ``name``: its registered label, or the name itself.

    Example:
        >>> metric_label("kendall_tau"), metric_label("tau"), metric_label("cosine")
        ('Kendall τ', 'Kendall τ', 'cosine')
    """
    return METRIC_LABELS.get(AGREEMENT_ALIASES.get(name, name), name)


def resolve_agreement_metric(name: str) -> str:
    """The registered name of ``name`` (an alias resolves to its metric).

    Raises:
        KeyError: unknown name, listing the registered ones.

    Example:
        >>> resolve_agreement_metric("tau")
        'kendall_tau'
    """
    resolved = AGREEMENT_ALIASES.get(name, name)
    if resolved not in AGREEMENT_METRICS:
        raise KeyError(f"unknown agreement metric {name!r}; choose from {sorted(AGREEMENT_METRICS)}.")
    return resolved


register_agreement_metric("kendall_tau", kendall_tau, p_value=True, aliases=("kendall", "tau"), label="Kendall τ")
register_agreement_metric("topk_kendall_tau", topk_kendall_tau, p_value=True, label="top-k Kendall τ")
register_agreement_metric("spearman", spearman, p_value=True, label="Spearman ρ")
register_agreement_metric("pearson", pearson, p_value=True, label="Pearson r")
register_agreement_metric("jsd", jensen_shannon, aliases=("jensen_shannon",), label="JSD")
register_agreement_metric("topk_overlap", topk_overlap, label="top-k overlap")

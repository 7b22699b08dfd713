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

from typing import Any, Callable, Dict, NamedTuple, Sequence

from lightning_xai.metrics.functional.agreement import (jensen_shannon, kendall_tau, pearson, spearman,
                                                        topk_kendall_tau, topk_overlap)

__all__ = ["AGREEMENT_ALIASES", "AGREEMENT_METRICS", "AgreementMetric", "register_agreement_metric",
           "resolve_agreement_metric"]


class AgreementMetric(NamedTuple):
    """A registered agreement metric: its function and whether it returns ``(value, p_value)``."""

    function: Callable[..., Any]
    p_value: bool


#: name -> (function(preds, target, mask, **options), whether it returns ``(value, p_value)``)
AGREEMENT_METRICS: Dict[str, AgreementMetric] = {}
#: other accepted spellings -> registered name
AGREEMENT_ALIASES: Dict[str, str] = {}


def register_agreement_metric(name: str, function: Callable[..., Any], *, p_value: bool = False,
                              aliases: Sequence[str] = (), replace: bool = False) -> AgreementMetric:
    """Make ``name`` (and ``aliases``) usable wherever agreement metrics are chosen by name.

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
    taken = [n for n in (name, *aliases) if n in AGREEMENT_ALIASES or (n in AGREEMENT_METRICS and
                                                                       not (replace and n == name))]
    if taken:
        raise ValueError(f"Agreement metric name(s) {taken} already registered; pick another name or pass "
                         "replace=True to redefine it.")
    if not callable(function):
        raise ValueError(f"Agreement metric {name!r}: function must be callable, got {function!r}.")
    entry = AgreementMetric(function, bool(p_value))
    AGREEMENT_METRICS[name] = entry
    AGREEMENT_ALIASES.update({alias: name for alias in aliases})
    return entry


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


register_agreement_metric("kendall_tau", kendall_tau, p_value=True, aliases=("kendall", "tau"))
register_agreement_metric("topk_kendall_tau", topk_kendall_tau, p_value=True)
register_agreement_metric("spearman", spearman, p_value=True)
register_agreement_metric("pearson", pearson, p_value=True)
register_agreement_metric("jsd", jensen_shannon, aliases=("jensen_shannon",))
register_agreement_metric("topk_overlap", topk_overlap)

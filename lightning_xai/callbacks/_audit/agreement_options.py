"""The options of :class:`~lightning_xai.callbacks.AttentionAudit` checked at ``__init__``: which maps it compares
(methods, pairs), with which agreement metrics, and their options; every mistake a
``MisconfigurationException`` naming the fix."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.attribution import ATTRIBUTION_METHODS
from lightning_xai.callbacks._audit.options import check_names, check_options_of_methods
from lightning_xai.metrics.registry import AGREEMENT_ALIASES, AGREEMENT_METRICS, resolve_agreement_metric

__all__ = ["check_agreement_options"]


def check_agreement_options(
    methods: Sequence[str],
    metrics: Sequence[str],
    pairs: Optional[Sequence[Sequence[str]]],
    method_options: Optional[Mapping[str, Mapping[str, Any]]],
    metric_options: Optional[Mapping[str, Mapping[str, Any]]],
    *,
    impermissible_key: Optional[str],
    counts: Mapping[str, Any],
) -> Tuple[List[str], List[str], Optional[List[Tuple[str, ...]]], Dict[str, Dict[str, Any]], Dict[str, Dict[str, Any]]]:
    """``(methods, metrics, pairs, method_options, metric_options)`` as the audit keeps them (metric names resolved,
    aliases of metric options too), after checking them (``counts``: options that must be ints >= 0).

    Example:
        >>> check_agreement_options(["gradient"], ["tau"], None, None, None, impermissible_key=None, counts={})
        (['gradient'], ['kendall_tau'], None, {}, {})
        >>> check_agreement_options(["attention"], ["jsd"], None, None, None, impermissible_key=None, counts={})
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit: 'attention' is always computed; list only the other methods.
    """
    if isinstance(methods, str) or isinstance(metrics, str):
        raise MisconfigurationException("AttentionAudit: methods and metrics are lists of names, not a string.")
    names = [str(m) for m in methods]
    if not names:
        raise MisconfigurationException(
            "AttentionAudit needs at least one attribution method to compare with attention."
        )
    if "attention" in names:
        raise MisconfigurationException("AttentionAudit: 'attention' is always computed; list only the other methods.")
    if len(set(names)) != len(names):
        raise MisconfigurationException(f"AttentionAudit: duplicate methods in {names}.")
    check_names(
        "AttentionAudit",
        "method",
        names,
        ATTRIBUTION_METHODS,
        " (or register one with lightning_xai.attribution.register_method)",
    )
    resolved = []
    for metric in metrics:
        try:
            resolved.append(resolve_agreement_metric(metric))
        except KeyError:
            raise MisconfigurationException(
                f"AttentionAudit: unknown metric {metric!r}; choose from {sorted(AGREEMENT_METRICS)} (or "
                "register one with lightning_xai.metrics.registry.register_agreement_metric)."
            ) from None
    if not resolved:
        raise MisconfigurationException("AttentionAudit needs at least one metric.")
    if impermissible_key is not None and (not isinstance(impermissible_key, str) or not impermissible_key):
        raise MisconfigurationException(
            f"AttentionAudit(impermissible_key) must be a batch key or None, got {impermissible_key!r}."
        )
    for name, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MisconfigurationException(f"AttentionAudit({name}) must be an int >= 0, got {count!r}.")
    maps = ["attention", *names]
    requested = None if pairs is None else [tuple(pair) for pair in pairs]
    for pair in requested or ():
        if len(pair) != 2 or pair[0] == pair[1] or any(p not in maps for p in pair):
            raise MisconfigurationException(f"AttentionAudit: pair {pair!r} must name two different maps among {maps}.")
    by_method = {k: dict(v) for k, v in (method_options or {}).items()}
    by_metric = {AGREEMENT_ALIASES.get(k, k): dict(v) for k, v in (metric_options or {}).items()}
    for key in by_method:
        if key not in names:
            raise MisconfigurationException(
                f"AttentionAudit: method_options for {key!r}, which is not in methods {names}."
            )
    check_options_of_methods("AttentionAudit", by_method)
    for key in by_metric:
        if key not in resolved:
            raise MisconfigurationException(
                f"AttentionAudit: metric_options for {key!r}, which is not in metrics {resolved}."
            )
    return names, resolved, requested, by_method, by_metric

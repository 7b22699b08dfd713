"""Agreement between two token score maps as torchmetrics ``Metric`` classes (per instance, then averaged).

Each class calls its functional twin in :mod:`lightning_xai.metrics.functional` on every ``update(preds, target,
mask)`` and keeps sums, so ``compute()`` returns, over all instances seen (synced across DDP processes):

* ``mean`` and ``std`` (population standard deviation, ``ddof=0`` like ``numpy.std``) of the per-instance values
  that are defined;
* ``count``: instances averaged; ``undefined_fraction``: share of instances whose value is undefined (NaN:
  constant map or a single real token for correlations, an all-zero map for JSD) — they are not averaged;
* for the correlations, ``significant_fraction``: the share of averaged instances with p ≤ ``significance``
  (0.05: Jain & Wallace's "fraction with p ≤ 0.05").

torchmetrics' own ``KendallRankCorrCoef``/``SpearmanCorrCoef``/``PearsonCorrCoef`` correlate *across samples*
(one coefficient per output column); these correlate *within* each instance over its real tokens.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.metrics._base import InstanceMeanMetric
from lightning_xai.metrics.functional._validation import resolve_k
from lightning_xai.metrics.functional.agreement import (
    jensen_shannon,
    kendall_tau,
    pearson,
    spearman,
    topk_kendall_tau,
    topk_overlap,
)

__all__ = ["JensenShannon", "KendallTau", "PearsonCorrelation", "SpearmanCorrelation", "TopKKendallTau", "TopKOverlap"]


class KendallTau(InstanceMeanMetric):
    """Per-instance Kendall τ (scipy τ-b by default) averaged over instances, with the fraction significant.

    Args:
        variant: ``"b"`` or ``"c"`` (see :func:`~lightning_xai.metrics.functional.kendall_tau`).
        significance: p-value threshold for ``significant_fraction``.

    Example:
        >>> import torch
        >>> metric = KendallTau()
        >>> metric.update(torch.tensor([[1., 2., 3., 0.]]), torch.tensor([[1., 3., 2., 9.]]),
        ...               torch.tensor([[True, True, True, False]]))
        >>> {k: round(float(v), 4) for k, v in metric.compute().items()}
        {'mean': 0.3333, 'std': 0.0, 'count': 1.0, 'undefined_fraction': 0.0, 'significant_fraction': 0.0}
    """

    higher_is_better = True

    def __init__(self, variant: str = "b", significance: float = 0.05, **kwargs) -> None:
        super().__init__(significance=significance, **kwargs)
        if variant not in ("b", "c"):
            raise ValueError(f"Unknown Kendall variant {variant!r}; use 'b' or 'c'.")
        self.variant = variant

    def update(self, preds: Tensor, target: Tensor, mask: Tensor) -> None:
        self._accumulate(*kendall_tau(preds, target, mask, variant=self.variant))


class TopKKendallTau(InstanceMeanMetric):
    """Per-instance Kendall τ over the union of both maps' top-k tokens
    (:func:`~lightning_xai.metrics.functional.topk_kendall_tau`).

    ``k=None`` uses Jain & Wallace's ``max(10, 0.1 · mean length)`` with the mean length of each updated batch.

    Example:
        >>> import torch
        >>> metric = TopKKendallTau(k=2)
        >>> metric.update(torch.tensor([[4., 3., 2., 1.]]), torch.tensor([[4., 3., 1., 2.]]),
        ...               torch.ones(1, 4, dtype=torch.bool))
        >>> float(metric.compute()["mean"])
        1.0
    """

    higher_is_better = True

    def __init__(
        self, k: Optional[Union[int, float]] = None, variant: str = "b", significance: float = 0.05, **kwargs
    ) -> None:
        super().__init__(significance=significance, **kwargs)
        if k is not None:
            resolve_k(k, torch.ones(1, dtype=torch.long))
        if variant not in ("b", "c"):
            raise ValueError(f"Unknown Kendall variant {variant!r}; use 'b' or 'c'.")
        self.k = k
        self.variant = variant

    def update(self, preds: Tensor, target: Tensor, mask: Tensor) -> None:
        self._accumulate(*topk_kendall_tau(preds, target, mask, k=self.k, variant=self.variant))


class _Correlation(InstanceMeanMetric):
    """A per-instance correlation with its p-value, ``function(preds, target, mask) -> (values, p_values)``."""

    higher_is_better = True
    function: Callable[[Tensor, Tensor, Tensor], Tuple[Tensor, Tensor]]  # a staticmethod in each subclass

    def __init__(self, significance: float = 0.05, **kwargs) -> None:
        super().__init__(significance=significance, **kwargs)

    def update(self, preds: Tensor, target: Tensor, mask: Tensor) -> None:
        self._accumulate(*type(self).function(preds, target, mask))


class SpearmanCorrelation(_Correlation):
    """Per-instance Spearman ρ (scipy ``spearmanr``) averaged over instances.

    Example:
        >>> import torch
        >>> metric = SpearmanCorrelation()
        >>> metric.update(torch.tensor([[1., 2., 3.]]), torch.tensor([[3., 2., 1.]]), torch.ones(1, 3, dtype=torch.bool))
        >>> round(float(metric.compute()["mean"]), 6)
        -1.0
    """

    function = staticmethod(spearman)


class PearsonCorrelation(_Correlation):
    """Per-instance Pearson r (scipy ``pearsonr``) averaged over instances, with the share with p ≤ ``significance``.

    Example:
        >>> import torch
        >>> metric = PearsonCorrelation(significance=0.01)
        >>> maps = torch.tensor([[1., 2., 3., 4.], [4., 1., 3., 2.]])
        >>> metric.update(maps, 2 * maps, torch.ones(2, 4, dtype=torch.bool))  # r = 1 for both rows, p = 0
        >>> [round(float(metric.compute()[key]), 6) for key in ("mean", "significant_fraction")]
        [1.0, 1.0]
    """

    function = staticmethod(pearson)


class JensenShannon(InstanceMeanMetric):
    """Per-instance Jensen–Shannon divergence of the |·|-normalised maps (natural log, ≤ ln 2), averaged.

    Example:
        >>> import torch
        >>> metric = JensenShannon()
        >>> metric.update(torch.tensor([[1., 1.]]), torch.tensor([[1., 1.]]), torch.ones(1, 2, dtype=torch.bool))
        >>> float(metric.compute()["mean"])
        0.0
    """

    higher_is_better = False

    def __init__(self, eps: float = 1e-10, **kwargs) -> None:
        super().__init__(**kwargs)
        if not (isinstance(eps, (int, float)) and eps >= 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be a finite number >= 0, got {eps!r}.")
        self.eps = eps

    def update(self, preds: Tensor, target: Tensor, mask: Tensor) -> None:
        self._accumulate(jensen_shannon(preds, target, mask, eps=self.eps))


class TopKOverlap(InstanceMeanMetric):
    """Per-instance Jaccard overlap of the two maps' top-k tokens (k an int or a fraction), averaged.

    Example:
        >>> import torch
        >>> metric = TopKOverlap(k=2)
        >>> metric.update(torch.tensor([[4., 3., 2., 1.]]), torch.tensor([[4., 1., 2., 3.]]),
        ...               torch.ones(1, 4, dtype=torch.bool))
        >>> round(float(metric.compute()["mean"]), 4)
        0.3333
    """

    higher_is_better = True

    def __init__(self, k: Union[int, float] = 0.2, **kwargs) -> None:
        super().__init__(**kwargs)
        resolve_k(k, torch.ones(1, dtype=torch.long))
        self.k = k

    def update(self, preds: Tensor, target: Tensor, mask: Tensor) -> None:
        self._accumulate(topk_overlap(preds, target, mask, k=self.k))

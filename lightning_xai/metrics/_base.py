"""Shared machinery of the Metric classes: per-instance values reduced to DDP-safe sums."""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["InstanceMeanMetric", "ValueMean", "summarize_values"]


class InstanceMeanMetric(Metric):
    """Mean and (population) standard deviation of a per-instance value over every instance seen.

    States are sums (``total``, ``total_sq``, ``count``, ``undefined``, ``significant``), all reduced with
    ``dist_reduce_fx="sum"``, so the value after a DDP sync equals the value computed in one process on the
    union of the data. Instances whose value is NaN (undefined, e.g. a correlation with a constant map) are
    not averaged; their share is reported as ``undefined_fraction``.
    """

    is_differentiable = False
    higher_is_better: Optional[bool] = True
    full_state_update = False

    total: Tensor
    total_sq: Tensor
    count: Tensor
    undefined: Tensor
    significant: Tensor

    def __init__(self, significance: Optional[float] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        if significance is not None and not 0.0 < significance < 1.0:
            raise ValueError(f"significance must lie in (0, 1), got {significance}.")
        self.significance = significance
        zero = lambda: torch.tensor(0.0, dtype=torch.float64)  # noqa: E731
        self.add_state("total", default=zero(), dist_reduce_fx="sum")
        self.add_state("total_sq", default=zero(), dist_reduce_fx="sum")
        self.add_state("count", default=zero(), dist_reduce_fx="sum")
        self.add_state("undefined", default=zero(), dist_reduce_fx="sum")
        self.add_state("significant", default=zero(), dist_reduce_fx="sum")

    def _accumulate(self, values: Tensor, p_values: Optional[Tensor] = None) -> None:
        values = values.detach().double()
        defined = ~torch.isnan(values)
        kept = values[defined]
        self.total += kept.sum()
        self.total_sq += (kept * kept).sum()
        self.count += defined.sum()
        self.undefined += (~defined).sum()
        if p_values is not None and self.significance is not None:
            self.significant += (p_values.detach().double()[defined] <= self.significance).sum()

    @staticmethod
    def _moments(total: Tensor, total_sq: Tensor, count: Tensor) -> Dict[str, Tensor]:
        if float(count) == 0:
            nan = torch.tensor(math.nan, dtype=torch.float64, device=total.device)
            return {"mean": nan, "std": nan.clone()}
        mean = total / count
        var = (total_sq / count - mean * mean).clamp(min=0.0)
        return {"mean": mean, "std": var.sqrt()}

    def compute(self) -> Dict[str, Tensor]:
        out = self._moments(self.total, self.total_sq, self.count)
        seen = self.count + self.undefined
        out["count"] = self.count.clone()
        out["undefined_fraction"] = self.undefined / seen if float(seen) > 0 else self.undefined * math.nan
        if self.significance is not None:
            out["significant_fraction"] = (
                self.significant / self.count if float(self.count) > 0 else self.significant * math.nan
            )
        return out


class ValueMean(InstanceMeanMetric):
    """:class:`InstanceMeanMetric` of values already computed per instance (the audit callbacks' aggregator).

    ``update(values, p_values=None)`` takes ``[N]`` values (NaN: undefined) and, with ``significance`` set,
    their p-values; ``compute()`` reports what every metric class does (``mean``, ``std``, ``count``,
    ``undefined_fraction`` and, with ``significance``, ``significant_fraction``), synced across DDP processes.

    Example:
        >>> metric = ValueMean(significance=0.05)
        >>> metric.update(torch.tensor([0.2, 0.4, float("nan")]), torch.tensor([0.01, 0.5, float("nan")]))
        >>> {k: round(float(v), 6) for k, v in metric.compute().items()}
        {'mean': 0.3, 'std': 0.1, 'count': 2.0, 'undefined_fraction': 0.333333, 'significant_fraction': 0.5}
    """

    higher_is_better: Optional[bool] = None

    def update(self, values: Tensor, p_values: Optional[Tensor] = None) -> None:
        values = torch.as_tensor(values, dtype=torch.float64, device=self.total.device).flatten()
        if p_values is not None:
            p_values = torch.as_tensor(p_values, dtype=torch.float64, device=self.total.device).flatten()
            if p_values.shape != values.shape:
                raise ValueError(f"ValueMean: {p_values.numel()} p-values for {values.numel()} values.")
        self._accumulate(values, p_values)


def summarize_values(
    values: Sequence[float], p_values: Optional[Sequence[float]] = None, alpha: float = 0.05
) -> Dict[str, float]:
    """:class:`ValueMean` of ``values`` in one call: mean, standard deviation (population, as ``numpy.std``),
    ``count`` and ``undefined`` (NaN values, left out of mean and std), ``undefined_fraction`` and — given
    p-values — the ``significant_fraction`` with ``p <= alpha``. The same code, so the same fields and numbers,
    as the torchmetrics classes and the audit callbacks' logged aggregates.

    Example:
        >>> {k: round(v, 6) for k, v in summarize_values([0.2, 0.4, float("nan")], [0.01, 0.5, float("nan")]).items()}
        {'mean': 0.3, 'std': 0.1, 'count': 2, 'undefined_fraction': 0.333333, 'significant_fraction': 0.5, 'undefined': 1}
    """
    metric = ValueMean(significance=alpha if p_values is not None else None, sync_on_compute=False)
    metric.update(
        torch.tensor(list(values), dtype=torch.float64),
        None if p_values is None else torch.tensor(list(p_values), dtype=torch.float64),
    )
    out: Dict[str, float] = {k: float(v) for k, v in metric.compute().items()}
    out["count"] = int(out["count"])
    out["undefined"] = int(metric.undefined)
    return out

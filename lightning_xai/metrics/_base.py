"""Shared machinery of the Metric classes: per-instance values reduced to DDP-safe sums."""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["InstanceMeanMetric"]


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
            out["significant_fraction"] = (self.significant / self.count if float(self.count) > 0
                                           else self.significant * math.nan)
        return out

"""Plausibility against human rationales as torchmetrics ``Metric`` classes (ERASER's token F1, IOU F1, AUPRC).

``update(scores, rationale, mask)``; states are sums reduced with ``dist_reduce_fx="sum"``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Union

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_xai.metrics._base import InstanceMeanMetric
from lightning_xai.metrics.functional._validation import resolve_k
from lightning_xai.metrics.functional.plausibility import _check_rationale, auprc, binarize, span_match_counts, token_f1

__all__ = ["AUPRC", "IOUF1", "TokenF1"]


def _check_cut(k: Optional[Union[int, float]], threshold: Optional[float]) -> None:
    if k is not None and threshold is not None:
        raise ValueError("Give either k (top-k tokens) or threshold (score >= threshold), not both.")
    if k is not None:
        resolve_k(k, torch.ones(1, dtype=torch.long))


class TokenF1(Metric):
    """ERASER's instance-macro token precision, recall and F1 of the binarised map vs the rationale.

    The map is binarised by top-``k``, by ``threshold``, or (neither) by the number of rationale tokens (see
    :func:`~lightning_xai.metrics.functional.binarize`). ``compute()`` → ``{"precision", "recall", "f1"}``, each
    the mean over instances of the per-instance value, and ``count``.

    Example:
        >>> import torch
        >>> metric = TokenF1(k=2)
        >>> metric.update(torch.tensor([[0.9, 0.8, 0.1, 0.0]]), torch.tensor([[True, False, True, False]]),
        ...               torch.ones(1, 4, dtype=torch.bool))
        >>> {k: float(v) for k, v in metric.compute().items()}
        {'precision': 0.5, 'recall': 0.5, 'f1': 0.5, 'count': 1.0}
    """

    is_differentiable = False
    higher_is_better: Optional[bool] = True
    full_state_update = False

    precision: Tensor
    recall: Tensor
    f1: Tensor
    count: Tensor

    def __init__(self, k: Optional[Union[int, float]] = None, threshold: Optional[float] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check_cut(k, threshold)
        self.k, self.threshold = k, threshold
        for name in ("precision", "recall", "f1", "count"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Tensor, rationale: Tensor, mask: Tensor) -> None:
        p, r, f = token_f1(scores, rationale, mask, k=self.k, threshold=self.threshold)
        self.precision += p.sum()
        self.recall += r.sum()
        self.f1 += f.sum()
        self.count += p.numel()

    def compute(self) -> Dict[str, Tensor]:
        n = self.count
        return {"precision": self.precision / n, "recall": self.recall / n, "f1": self.f1 / n, "count": n.clone()}


class IOUF1(Metric):
    """ERASER's IOU F1 (micro): predicted spans matching a gold span with IOU ≥ ``iou_threshold`` (0.5).

    Precision = Σ matched / Σ predicted spans, recall = Σ matched / Σ gold spans over all instances (the counts
    are the states), F1 from those — as ERASER's ``partial_match_score`` micro average. ``compute()`` →
    ``{"precision", "recall", "f1"}``.

    Example:
        >>> import torch
        >>> metric = IOUF1(threshold=0.5)
        >>> metric.update(torch.tensor([[0.9, 0.8, 0.0, 0.7]]), torch.tensor([[True, True, True, False]]),
        ...               torch.ones(1, 4, dtype=torch.bool))
        >>> {k: round(float(v), 4) for k, v in metric.compute().items()}
        {'precision': 0.5, 'recall': 1.0, 'f1': 0.6667}
    """

    is_differentiable = False
    higher_is_better: Optional[bool] = True
    full_state_update = False

    matched: Tensor
    predicted: Tensor
    gold: Tensor

    def __init__(
        self,
        k: Optional[Union[int, float]] = None,
        threshold: Optional[float] = None,
        iou_threshold: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        _check_cut(k, threshold)
        if not 0.0 < iou_threshold <= 1.0:
            raise ValueError(f"iou_threshold must lie in (0, 1], got {iou_threshold}.")
        self.k, self.threshold, self.iou_threshold = k, threshold, iou_threshold
        for name in ("matched", "predicted", "gold"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: Tensor, rationale: Tensor, mask: Tensor) -> None:
        _check_rationale(rationale, mask)
        pred = binarize(scores, mask, rationale, k=self.k, threshold=self.threshold)
        matched, n_pred, n_gold = span_match_counts(pred, rationale & mask, self.iou_threshold)
        self.matched += matched.sum()
        self.predicted += n_pred.sum()
        self.gold += n_gold.sum()

    def compute(self) -> Dict[str, Tensor]:
        zero = torch.zeros_like(self.matched)
        precision = self.matched / self.predicted if float(self.predicted) > 0 else zero
        recall = self.matched / self.gold if float(self.gold) > 0 else zero
        f1 = 2 * precision * recall / (precision + recall) if float(precision + recall) > 0 else zero
        return {"precision": precision, "recall": recall, "f1": f1}


class AUPRC(InstanceMeanMetric):
    """Per-instance AUPRC (sklearn ``average_precision_score``) of the map ranking the rationale, averaged.

    Instances without a rationale token are undefined (``undefined_fraction``) and not averaged.

    Example:
        >>> import torch
        >>> metric = AUPRC()
        >>> metric.update(torch.tensor([[0.1, 0.4, 0.35, 0.8]]), torch.tensor([[False, False, True, True]]),
        ...               torch.ones(1, 4, dtype=torch.bool))
        >>> round(float(metric.compute()["mean"]), 4)
        0.8333
    """

    higher_is_better = True

    def update(self, scores: Tensor, rationale: Tensor, mask: Tensor) -> None:
        self._accumulate(auprc(scores, rationale, mask))

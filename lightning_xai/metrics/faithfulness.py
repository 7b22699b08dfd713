"""Faithfulness of token score maps as torchmetrics ``Metric`` classes: ERASER comprehensiveness, sufficiency
and AOPC (by deleting tokens), and Serrano & Smith's attention-erasure decision flip.

``update`` takes the model, the batch and (for ERASER) the score map; the states are sums reduced with
``dist_reduce_fx="sum"``, so DDP-synced values equal a single process's on the same data. ``compute()`` returns
a dict (documented per class).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Union

import torch
from torch import Tensor
from torchmetrics import Metric

from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.metrics._base import InstanceMeanMetric
from lightning_xai.metrics.functional._validation import resolve_k
from lightning_xai.metrics.functional.decision_flips import decision_flip
from lightning_xai.metrics.functional.erasure import RANKINGS
from lightning_xai.metrics.functional.faithfulness import AOPC_BINS, erasure_scores

__all__ = ["AOPC", "Comprehensiveness", "DecisionFlip", "Sufficiency"]


def _check_k(k: Union[int, float]) -> None:
    resolve_k(k, torch.ones(1, dtype=torch.long))


class _TopKErasure(InstanceMeanMetric):
    """One of ERASER's two top-k erasure scores (``_which``: 0 comprehensiveness, 1 sufficiency), per instance."""

    _which = 0

    def __init__(self, k: Union[int, float] = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _check_k(k)
        self.k = k

    def update(self, model: ExplainableModel, batch: Batch, scores: Tensor, target: Any = None) -> None:
        self._accumulate(erasure_scores(model, batch, scores, [self.k], target)[self._which][0])


class Comprehensiveness(_TopKErasure):
    """ERASER comprehensiveness p(ŷ|x) − p(ŷ|x∖r) of the top-k tokens, averaged over instances.

    ``compute()`` → ``{"mean", "std", "count", "undefined_fraction"}`` (see :class:`InstanceMeanMetric`).

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> metric = Comprehensiveness(k=0.5)
        >>> metric.update(model, batch, torch.tensor([[0.1, 0.9, 0.2, 0.3]]))
        >>> sorted(metric.compute())
        ['count', 'mean', 'std', 'undefined_fraction']
    """

    higher_is_better = True
    _which = 0


class Sufficiency(_TopKErasure):
    """ERASER sufficiency p(ŷ|x) − p(ŷ|r) of the top-k tokens, averaged over instances (lower is better).

    Example:
        >>> from lightning_xai.metrics.functional import sufficiency
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch, scores = {"input_ids": torch.tensor([[3, 4, 5, 6]])}, torch.tensor([[0.1, 0.9, 0.2, 0.3]])
        >>> batch["mask"] = torch.ones(1, 4, dtype=torch.bool)
        >>> metric = Sufficiency(k=1.0)  # the rationale is the whole input: nothing changes
        >>> metric.update(model, batch, scores)
        >>> float(metric.compute()["mean"]), float(sufficiency(model, batch, scores, k=1.0)[0])
        (0.0, 0.0)
    """

    higher_is_better = False
    _which = 1


class AOPC(Metric):
    """ERASER AOPC: comprehensiveness and sufficiency averaged over top-k bins, then over instances.

    One ``update`` scores every bin of the batch in batched forward passes. ``compute()`` →
    ``{"comprehensiveness", "comprehensiveness_std", "sufficiency", "sufficiency_std", "count"}`` where the
    std is the population std over instances of their per-instance AOPC.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> metric = AOPC()
        >>> metric.update(model, batch, torch.tensor([[0.1, 0.9, 0.2, 0.3]]))
        >>> sorted(metric.compute())
        ['comprehensiveness', 'comprehensiveness_std', 'count', 'sufficiency', 'sufficiency_std']
    """

    is_differentiable = False
    higher_is_better: Optional[bool] = None
    full_state_update = False

    comp_total: Tensor
    comp_sq: Tensor
    suff_total: Tensor
    suff_sq: Tensor
    count: Tensor

    def __init__(self, bins: Sequence[Union[int, float]] = AOPC_BINS, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if len(bins) == 0:
            raise ValueError("bins is empty; give top-k sizes (ints) or fractions in (0, 1], e.g. AOPC_BINS.")
        for k in bins:
            _check_k(k)
        self.bins = tuple(bins)
        for name in ("comp_total", "comp_sq", "suff_total", "suff_sq", "count"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, model: ExplainableModel, batch: Batch, scores: Tensor, target: Any = None) -> None:
        comp, suff = erasure_scores(model, batch, scores, list(self.bins), target)
        comp, suff = comp.mean(0).double(), suff.mean(0).double()
        self.comp_total += comp.sum()
        self.comp_sq += (comp * comp).sum()
        self.suff_total += suff.sum()
        self.suff_sq += (suff * suff).sum()
        self.count += comp.numel()

    def compute(self) -> Dict[str, Tensor]:
        comp = InstanceMeanMetric._moments(self.comp_total, self.comp_sq, self.count)
        suff = InstanceMeanMetric._moments(self.suff_total, self.suff_sq, self.count)
        return {
            "comprehensiveness": comp["mean"],
            "comprehensiveness_std": comp["std"],
            "sufficiency": suff["mean"],
            "sufficiency_std": suff["std"],
            "count": self.count.clone(),
        }


class DecisionFlip(Metric):
    """Serrano & Smith's decision flip (:func:`~lightning_xai.metrics.functional.decision_flips.decision_flip`) over many batches.

    Args:
        ranking: default ranking for ``update`` (``"attention"``, ``"random"``, ``"gradient"``,
            ``"grad_x_attention"``); ``update(..., ranking=map)`` may pass a ``[B, T]`` score map instead.
        seed: seed of the generator behind ``ranking="random"`` (reproducible rankings).
        max_rows: rows per forward pass.

    ``compute()`` →

    * ``flip_rate``: share of instances whose decision flipped before one item was left;
    * ``items_mean``, ``attention_mass_mean``, ``fraction_mean`` (and ``fraction_std``): over the instances that
      flipped, the items removed, the attention mass removed and the fraction of items removed (Serrano &
      Smith's quantities; instances that never flip — their −1 — are excluded);
    * ``count``: instances seen.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> metric = DecisionFlip("random", seed=0)
        >>> metric.update(model, batch)
        >>> sorted(metric.compute())
        ['attention_mass_mean', 'count', 'flip_rate', 'fraction_mean', 'fraction_std', 'items_mean']
    """

    is_differentiable = False
    higher_is_better: Optional[bool] = False  # fewer items to flip = a ranking that finds what the model uses
    full_state_update = False

    flipped: Tensor
    count: Tensor
    items: Tensor
    mass: Tensor
    fraction: Tensor
    fraction_sq: Tensor

    def __init__(self, ranking: str = "attention", seed: int = 0, max_rows: int = 2048, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if ranking not in RANKINGS:
            raise ValueError(
                f"Unknown ranking {ranking!r}; choose one of {list(RANKINGS)} (or pass a score map to update)."
            )
        self.ranking = ranking
        self.seed = seed
        self.max_rows = max_rows
        self._generator = torch.Generator().manual_seed(seed)
        for name in ("flipped", "count", "items", "mass", "fraction", "fraction_sq"):
            self.add_state(name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, model: ExplainableModel, batch: Batch, ranking: Optional[Union[str, Tensor]] = None) -> None:
        result = decision_flip(
            model,
            batch,
            self.ranking if ranking is None else ranking,
            generator=self._generator,
            max_rows=self.max_rows,
        )
        f = result.flipped
        self.count += f.numel()
        self.flipped += f.sum()
        self.items += result.items_removed[f].double().sum()
        self.mass += result.attention_removed[f].double().sum()
        frac = result.fraction_removed[f].double()
        self.fraction += frac.sum()
        self.fraction_sq += (frac * frac).sum()

    def compute(self) -> Dict[str, Tensor]:
        moments = InstanceMeanMetric._moments(self.fraction, self.fraction_sq, self.flipped)
        flipped = self.flipped
        nan = torch.tensor(math.nan, dtype=torch.float64, device=flipped.device)
        per = (lambda v: v / flipped) if float(flipped) > 0 else (lambda v: nan.clone())
        return {
            "flip_rate": self.flipped / self.count if float(self.count) > 0 else nan.clone(),
            "items_mean": per(self.items),
            "attention_mass_mean": per(self.mass),
            "fraction_mean": moments["mean"],
            "fraction_std": moments["std"],
            "count": self.count.clone(),
        }

"""Pearson's r and Spearman's ρ between two token score maps, per instance over its real tokens, with scipy's p-values
and conventions (see :mod:`~lightning_xai.metrics.functional.agreement`, which re-exports them).
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from lightning_xai.metrics.functional._special import two_sided_t_pvalue
from lightning_xai.metrics.functional._validation import check_maps

__all__ = ["pearson", "spearman"]


def _average_ranks(values: Tensor, mask: Tensor) -> Tensor:
    """1-based ranks over real tokens with ties given their average rank (scipy ``rankdata(method="average")``)."""
    B, T = values.shape
    filled = values.masked_fill(~mask, float("nan"))
    ordered, order = torch.sort(filled, dim=1, stable=True)
    starts = torch.ones(B, T, dtype=torch.bool, device=values.device)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = torch.cumsum(starts.long(), dim=1) - 1
    sizes = torch.zeros(B, T, dtype=torch.long, device=values.device).scatter_add_(1, group, torch.ones_like(group))
    positions = torch.arange(T, device=values.device).expand(B, T)
    first = torch.full((B, T), T, dtype=torch.long, device=values.device).scatter_reduce_(
        1, group, positions.contiguous(), reduce="amin"
    )
    rank_sorted = first.gather(1, group).double() + (sizes.gather(1, group).double() + 1) / 2
    ranks = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    return ranks.masked_fill(~mask, 0.0)


def _masked_pearson(x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    x, y = x.double().masked_fill(~mask, 0.0), y.double().masked_fill(~mask, 0.0)
    n = mask.sum(1, keepdim=True).double()
    xc = (x - x.sum(1, keepdim=True) / n).masked_fill(~mask, 0.0)
    yc = (y - y.sum(1, keepdim=True) / n).masked_fill(~mask, 0.0)
    # scale first (as scipy does) so tiny or huge maps do not under/overflow
    xc = xc / xc.abs().amax(1, keepdim=True).clamp_min(1e-300)
    yc = yc / yc.abs().amax(1, keepdim=True).clamp_min(1e-300)
    r = (xc * yc).sum(1) / (torch.linalg.vector_norm(xc, dim=1) * torch.linalg.vector_norm(yc, dim=1))
    return r.clamp(-1.0, 1.0)


def _constant(values: Tensor, mask: Tensor) -> Tensor:
    filled_hi = values.masked_fill(~mask, float("-inf")).amax(1)
    filled_lo = values.masked_fill(~mask, float("inf")).amin(1)
    return filled_hi == filled_lo


def _correlation(preds: Tensor, target: Tensor, mask: Tensor, *, ranked: bool, p_two: float) -> Tuple[Tensor, Tensor]:
    """Pearson's r of the maps (of their average ranks if ``ranked``: Spearman's ρ) with the t-test p-value;
    ``p_two`` is the p-value at n = 2 (scipy: 1 for Pearson, NaN for Spearman); NaN where a map is constant."""
    check_maps(preds, target, mask=mask)
    n = mask.sum(1)
    undefined = _constant(preds, mask) | _constant(target, mask)
    if ranked:
        preds, target = _average_ranks(preds, mask), _average_ranks(target, mask)
    r = _masked_pearson(preds, target, mask)
    p = torch.where(n > 2, two_sided_t_pvalue(r, n), torch.full_like(r, p_two))
    nan = torch.full_like(r, float("nan"))
    return torch.where(undefined, nan, r), torch.where(undefined, nan, p)


def pearson(preds: Tensor, target: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Pearson's r per instance over real tokens with scipy's two-sided p-value ``I_{1−r²}((n−2)/2, ½)``.

    Equal to ``scipy.stats.pearsonr`` per instance; constant maps (and n = 1) give NaN; n = 2 gives p = 1.

    Example:
        >>> import torch
        >>> r, p = pearson(torch.tensor([[1., 2., 3., 5.]]), torch.tensor([[2., 4., 5., 4.]]),
        ...                torch.ones(1, 4, dtype=torch.bool))
        >>> round(float(r[0]), 4), round(float(p[0]), 4)
        (0.5817, 0.4183)
    """
    return _correlation(preds, target, mask, ranked=False, p_two=1.0)


def spearman(preds: Tensor, target: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Spearman's ρ (Pearson of average ranks) per instance over real tokens, with scipy's t-test p-value.

    Equal to ``scipy.stats.spearmanr`` per instance; constant maps (and n = 1) give NaN; n = 2 gives ρ = ±1
    and p = NaN, as scipy.

    Example:
        >>> import torch
        >>> rho, p = spearman(torch.tensor([[1., 2., 3., 5.]]), torch.tensor([[2., 4., 5., 4.]]),
        ...                   torch.ones(1, 4, dtype=torch.bool))
        >>> round(float(rho[0]), 4), round(float(p[0]), 4)
        (0.6325, 0.3675)
    """
    return _correlation(preds, target, mask, ranked=True, p_two=float("nan"))

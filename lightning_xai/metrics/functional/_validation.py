"""Input checks shared by every functional metric: shapes, masks, finiteness, ``k``."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = ["check_distributions", "check_maps", "check_mask", "resolve_k", "topk_mask"]


def check_mask(mask: Tensor, shape: Tuple[int, ...], name: str = "mask") -> Tensor:
    """Validate a ``[B, T]`` bool mask of real tokens with at least one True per row."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [B, T] of bools, got {type(mask).__name__}.")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got {mask.dtype}; pass mask.bool().")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but the score maps are {tuple(shape)}; they must match [B, T]."
        )
    if mask.numel() and int(mask.sum(1).min()) > 0:  # the common case in one reduction
        return mask
    empty = (~mask.any(dim=1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(
            f"{name} rows {empty.tolist()[:10]} have no real token; a metric over real tokens is "
            "undefined there. Drop empty examples before computing metrics."
        )
    return mask


def check_maps(*maps: Tensor, mask: Optional[Tensor] = None, names: Tuple[str, ...] = ("preds", "target")) -> None:
    """Validate ``[B, T]`` floating score maps of one shape, finite at real tokens (pads may hold anything)."""
    for tensor, name in zip(maps, names):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [B, T], got {type(tensor).__name__}.")
        if tensor.ndim != 2:
            raise ValueError(
                f"{name} must be a [B, T] score map (one row per instance), got shape {tuple(tensor.shape)}."
            )
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {tensor.dtype}; pass {name}.float().")
    first = maps[0]
    for tensor, name in zip(maps[1:], names[1:]):
        if tensor.shape != first.shape:
            raise ValueError(
                f"{names[0]} has shape {tuple(first.shape)} but {name} has {tuple(tensor.shape)}; "
                "score maps must have the same [B, T] shape."
            )
    if mask is not None:
        check_mask(mask, tuple(first.shape))
    for tensor, name in zip(maps, names):
        probe = tensor if mask is None else tensor.masked_fill(~mask, 0.0)
        if math.isfinite(float(probe.sum())):  # NaN and inf propagate into a sum: finite sum => all real finite
            continue
        bad = ~torch.isfinite(tensor)
        if mask is not None:
            bad = bad & mask
        rows = bad.any(dim=1).nonzero().flatten()
        if rows.numel():
            raise ValueError(
                f"{name} has NaN or inf at real tokens of rows {rows.tolist()[:10]}; metrics need finite "
                "scores (check the attribution for overflow, or replace with torch.nan_to_num)."
            )


def resolve_k(k: Union[int, float], lengths: Tensor, name: str = "k") -> Tensor:
    """Per-instance top-k sizes: an int ``k`` (capped at the length) or a fraction in (0, 1] (``ceil(k·n)``, ≥ 1)."""
    if isinstance(k, bool) or not isinstance(k, (int, float)):
        raise TypeError(f"{name} must be an int >= 1 or a float fraction in (0, 1], got {k!r}.")
    if isinstance(k, int):
        if k < 1:
            raise ValueError(f"{name}={k} is out of range: an int {name} must be >= 1 (or pass a fraction in (0, 1]).")
        return lengths.clamp(max=k)
    if not (0.0 < k <= 1.0) or math.isnan(k):
        raise ValueError(f"{name}={k} is out of range: a float {name} is a fraction of the real tokens in (0, 1].")
    return torch.ceil(lengths.double() * k - 1e-9).long().clamp(min=1)


def topk_mask(scores: Tensor, mask: Tensor, k: Tensor) -> Tensor:
    """``[B, T]`` bool: the ``k[b]`` highest-scoring real tokens of each row (ties broken by lower position)."""
    T = scores.shape[1]
    if T == 0:
        return mask.clone()
    filled = scores.masked_fill(~mask, float("-inf"))
    # stable descending sort: among equal scores the earlier position ranks first
    order = torch.sort(filled, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(T, device=scores.device).expand_as(order).contiguous())
    return (rank < k.unsqueeze(1)) & mask


def _rows(where: Tensor) -> list:
    """The leading indices (as tuples, or ints for one leading dimension) of the first rows marked in ``where``."""
    found = where.reshape(-1).nonzero()[:10].tolist() if where.dim() == 0 else where.nonzero()[:10].tolist()
    return [r[0] if len(r) == 1 else tuple(r) for r in found]


def check_distributions(*dists: Tensor, names: Tuple[str, ...] = ("p", "q")) -> None:
    """Validate probability distributions over the last dimension: finite, non-negative, each summing to 1.

    The leading dimensions must broadcast against each other and the last dimensions must be equal. Sums may
    miss 1 by ``max(1e-3, 2·eps)`` of the dtype (softmax rounding in bf16); entries down to minus that are
    accepted as rounding. Logits, raw scores and unnormalised masses are refused with the row and the fix. One
    host synchronisation when the inputs are valid.
    """
    for tensor, name in zip(dists, names):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of probabilities, got {type(tensor).__name__}.")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor of probabilities, got {tensor.dtype}.")
        if tensor.dim() == 0:
            raise ValueError(f"{name} is a scalar; give distributions over the last dimension ([..., K]).")
    shapes = [tuple(t.shape) for t in dists]
    if len({shape[-1] for shape in shapes}) > 1:
        raise ValueError(
            f"{' and '.join(names[: len(dists)])} have shapes {' and '.join(map(str, shapes))}: "
            "distributions over the last dimension need the same number of outcomes there."
        )
    try:
        torch.broadcast_shapes(*shapes)
    except RuntimeError:
        raise ValueError(
            f"{' and '.join(names[: len(dists)])} have shapes {' and '.join(map(str, shapes))}, whose "
            "leading dimensions do not broadcast; give equal shapes or size-1 dimensions "
            "(e.g. [B, K, T] against [B, 1, T])."
        ) from None
    with torch.no_grad():
        flags = []
        for tensor in dists:
            tol = max(1e-3, 2 * torch.finfo(tensor.dtype).eps)
            values = tensor.detach()
            finite = torch.isfinite(values).all(-1)
            negative = (values < -tol).any(-1)
            off = (values.double().sum(-1) - 1.0).abs() > tol
            flags.append((finite, negative, off))
        if not bool(torch.stack([(~f | n | o).any() for f, n, o in flags]).any()):
            return
    for (finite, negative, off), tensor, name in zip(flags, dists, names):
        fix = (
            f"{name} must hold probabilities over its last dimension (e.g. logits.softmax(-1)); "
            f"normalise masses with {name} / {name}.sum(-1, keepdim=True)"
        )
        if not bool(finite.all()):
            raise ValueError(f"{name} has NaN or inf in rows {_rows(~finite)}; {fix}.")
        if bool(negative.any()):
            raise ValueError(
                f"{name} has negative entries in rows {_rows(negative)} (logits or signed scores?); {fix}."
            )
        if bool(off.any()):
            sums = tensor.detach().double().sum(-1)[off][:3].tolist()
            raise ValueError(
                f"{name} does not sum to 1 in rows {_rows(off)} (sums {[round(v, 4) for v in sums]}); {fix}."
            )

"""Input checks shared by every functional metric: shapes, masks, finiteness, ``k``."""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = ["check_maps", "check_mask", "resolve_k", "topk_mask"]


def check_mask(mask: Tensor, shape: Tuple[int, ...], name: str = "mask") -> Tensor:
    """Validate a ``[B, T]`` bool mask of real tokens with at least one True per row."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [B, T] of bools, got {type(mask).__name__}.")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got {mask.dtype}; pass mask.bool().")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)} but the score maps are {tuple(shape)}; "
                         "they must match [B, T].")
    if mask.numel() and int(mask.sum(1).min()) > 0:  # the common case in one reduction
        return mask
    empty = (~mask.any(dim=1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(f"{name} rows {empty.tolist()[:10]} have no real token; a metric over real tokens is "
                         "undefined there. Drop empty examples before computing metrics.")
    return mask


def check_maps(*maps: Tensor, mask: Optional[Tensor] = None, names: Tuple[str, ...] = ("preds", "target")) -> None:
    """Validate ``[B, T]`` floating score maps of one shape, finite at real tokens (pads may hold anything)."""
    for tensor, name in zip(maps, names):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [B, T], got {type(tensor).__name__}.")
        if tensor.ndim != 2:
            raise ValueError(f"{name} must be a [B, T] score map (one row per instance), got shape "
                             f"{tuple(tensor.shape)}.")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {tensor.dtype}; pass {name}.float().")
    first = maps[0]
    for tensor, name in zip(maps[1:], names[1:]):
        if tensor.shape != first.shape:
            raise ValueError(f"{names[0]} has shape {tuple(first.shape)} but {name} has {tuple(tensor.shape)}; "
                             "score maps must have the same [B, T] shape.")
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
            raise ValueError(f"{name} has NaN or inf at real tokens of rows {rows.tolist()[:10]}; metrics need finite "
                             "scores (check the attribution for overflow, or replace with torch.nan_to_num).")


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

"""Reductions of a transformer's raw attention maps to one ``[B, T]`` token distribution.

Every built-in reduction reads the **pooled query row(s)** — the row of the position the classifier reads (see
:mod:`lightning_xai.adapters.huggingface.pooling`): ``[CLS]`` for the BERT family, each row's last non-pad token for
decoder classifiers, the mean of the rows over ``attention_mask`` for mean-pooled heads. For a causal model that
row is the only one that sees the whole sentence (row 0 sees the first token only), so "attention" of a decoder
classifier means the attention of its last real token.

* ``"cls_last_mean"`` (default): the last layer's pooled row, averaged over heads (the name is historical: the
  row is the pooled one, ``[CLS]`` only for the BERT family);
* ``"cls_last_max"``: the same row, maximum over heads;
* ``"L:H"`` (e.g. ``"-1:3"``, ``"5:mean"``): the pooled row of head ``H`` (or ``mean``/``max``) of layer ``L``;
* ``"rollout"``: attention rollout (Abnar & Zuidema, 2020), the pooled row of ``R = Â_L ⋯ Â_1``;
* a callable ``f(raw_attentions, batch) -> [B, T]`` non-negative scores.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch

__all__ = ["Reduction", "attention_rollout", "parse_reduction", "pooled_rows", "renormalise", "token_distribution"]

Reduction = Union[str, Callable[[Tuple[Tensor, ...], Batch], Tensor]]
#: a parsed reduction: ``f(raw_attentions, batch, query_mask [B, T]) -> [B, T]``
Parsed = Callable[[Tuple[Tensor, ...], Batch, Tensor], Tensor]


def attention_rollout(raw_attentions: Sequence[Tensor], query_index: Optional[int] = 0) -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020).

    Per layer the heads are averaged and the residual connection is added as an identity,
    ``Â_l = (mean_h A_l + I) / 2`` with every row renormalised to sum to 1; the layers are composed as
    ``R = Â_L Â_{L-1} ⋯ Â_1`` (``R[i, j]``: how much of input token ``j`` reaches position ``i`` at the top).

    Args:
        raw_attentions: per-layer ``[B, heads, T, T]`` probabilities, first layer first.
        query_index: the row to return (0 = ``[CLS]``); ``None`` returns the whole ``[B, T, T]`` matrix.

    Returns:
        ``[B, T]`` (or ``[B, T, T]``) rollout; rows sum to 1 over all positions (special tokens included).

    Example:
        >>> import torch
        >>> A = torch.tensor([[[[0.5, 0.5], [0.0, 1.0]]]])   # 1 layer, 1 head, 2 tokens
        >>> attention_rollout([A])
        tensor([[0.7500, 0.2500]])
    """
    if not raw_attentions:
        raise ValueError("attention_rollout needs at least one layer of attention probabilities.")
    rollout: Optional[Tensor] = None
    for layer in raw_attentions:
        if layer.dim() != 4 or layer.shape[-1] != layer.shape[-2]:
            raise ValueError(f"each layer must be [B, heads, T, T]; got {tuple(layer.shape)}.")
        mixed = layer.mean(dim=1)
        eye = torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        mixed = (mixed + eye) / 2
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
    assert rollout is not None
    return rollout if query_index is None else rollout[:, query_index, :]


def pooled_rows(maps: Tensor, query_mask: Tensor) -> Tensor:
    """The pooled query row(s) of ``maps`` (``[B, heads, T, T]`` → ``[B, heads, T]``, ``[B, T, T]`` → ``[B, T]``).

    With one query position per row this is that row exactly; with several, their mean.

    Example:
        >>> maps = torch.arange(8.0).view(1, 2, 2, 2)
        >>> pooled_rows(maps, torch.tensor([[False, True]])).tolist()
        [[[2.0, 3.0], [6.0, 7.0]]]
    """
    B, T = query_mask.shape
    if bool((query_mask.sum(-1) == 1).all()):
        index, positions = torch.arange(B, device=maps.device), query_mask.long().argmax(-1).to(maps.device)
        return maps[index, :, positions] if maps.dim() == 4 else maps[index, positions]
    weights = query_mask.to(maps.dtype) / query_mask.sum(dim=-1, keepdim=True).clamp_min(1).to(maps.dtype)
    return (maps * weights.view(B, *([1] * (maps.dim() - 3)), T, 1)).sum(dim=-2)


def renormalise(scores: Tensor, mask: Tensor) -> Tensor:
    """``scores`` set to 0 outside ``mask`` and divided by their sum over ``mask``."""
    scores = scores.masked_fill(~mask, 0.0)
    total = scores.sum(dim=-1, keepdim=True)
    return scores / total.clamp_min(torch.finfo(scores.dtype).tiny)


def token_distribution(reduced: Tensor, mask: Tensor) -> Tensor:
    """A reduction's ``[B, T]`` map as a distribution over ``mask`` (:func:`renormalise`); a map of another shape
    (a user's reduction callable) is refused with both shapes.

    Example:
        >>> token_distribution(torch.tensor([[2.0, 1.0, 1.0]]), torch.tensor([[True, True, False]]))
        tensor([[0.6667, 0.3333, 0.0000]])
    """
    if reduced.shape != mask.shape:
        raise ValueError(
            f"the attention reduction returned shape {tuple(reduced.shape)}; expected {tuple(mask.shape)}."
        )
    return renormalise(reduced, mask)


def _layer(raw: Tuple[Tensor, ...], layer: int) -> Tensor:
    if not -len(raw) <= layer < len(raw):
        raise ValueError(f"attention layer {layer} does not exist: the model has {len(raw)} layers.")
    return raw[layer]


def _head(rows: Tensor, head: int) -> Tensor:
    if not -rows.shape[1] <= head < rows.shape[1]:
        raise ValueError(f"attention head {head} does not exist: the layer has {rows.shape[1]} heads.")
    return rows[:, head]


def parse_reduction(attention: Reduction) -> Parsed:
    """A reduction name (or callable) as ``f(raw_attentions, batch, query_mask) -> [B, T]``.

    Example:
        >>> f = parse_reduction("-1:mean")
        >>> f((torch.full((1, 2, 3, 3), 1 / 3),), {}, torch.tensor([[True, False, False]])).tolist()
        [[0.3333333432674408, 0.3333333432674408, 0.3333333432674408]]
    """
    if callable(attention):
        return lambda raw, batch, qmask: attention(raw, batch)
    if not isinstance(attention, str):
        raise ValueError(f"attention must be a string or a callable, got {type(attention).__name__}.")
    if attention == "cls_last_mean":
        return lambda raw, batch, qmask: pooled_rows(raw[-1], qmask).mean(dim=1)
    if attention == "cls_last_max":
        return lambda raw, batch, qmask: pooled_rows(raw[-1], qmask).amax(dim=1)
    if attention == "rollout":
        return lambda raw, batch, qmask: pooled_rows(attention_rollout(raw, None), qmask)
    if ":" in attention:
        layer_text, head_text = attention.split(":", 1)
        try:
            layer = int(layer_text)
        except ValueError:
            layer = None
        if layer is not None and head_text in ("mean", "max"):
            pool = (lambda rows: rows.mean(dim=1)) if head_text == "mean" else (lambda rows: rows.amax(dim=1))
            return lambda raw, batch, qmask: pool(pooled_rows(_layer(raw, layer), qmask))
        if layer is not None and head_text.lstrip("-").isdigit():
            head = int(head_text)
            return lambda raw, batch, qmask: _head(pooled_rows(_layer(raw, layer), qmask), head)
    raise ValueError(
        f"Unknown attention reduction {attention!r}; use 'cls_last_mean', 'cls_last_max', "
        "'rollout', 'LAYER:HEAD' (e.g. '-1:0', '5:mean') or a callable f(raw_attentions, batch)."
    )

"""``"value_zeroing"``: how much each token's value vectors change a layer's outputs (Mohebbi et al., 2023).

Mohebbi, Zuidema, Chrupała & Alishahi, "Quantifying Context Mixing in Transformers" (EACL 2023). For layer ``l`` and
token ``j``, every head's value vector of ``j`` is set to zero and layer ``l`` is recomputed (attention, residual,
layer norms, feed-forward: the whole block) from the same input; ``C^l_{ij}`` is the cosine distance between the
original output ``x^l_i`` and the recomputed ``x̃^l_i``; each row is divided by its sum over the non-pad positions.
The residual connection is inside the measure, so the layers are rolled out *without* an added identity:
``R = C^L ⋯ C^1`` (as in the authors' code).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, List, Optional

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch
from lightning_xai.attribution.context_mixing._hf_internals import (Trace, normalise_rows, rerun_layer, rollout_rows,
                                                                     traced_layers)
from lightning_xai.attribution.core import register_method

__all__ = ["value_zeroing", "value_zeroing_matrix"]


def value_zeroing_matrix(tr: Trace, layer: int, internal_batch_size: Optional[int] = None) -> Tensor:
    """``[B, T, T]`` unnormalised ``C^l_{ij}`` (query ``i``, zeroed token ``j``) for layer ``layer`` of a trace.

    Distances below 0 (float rounding of a cosine of 1) are clamped to 0.

    All ``B·T`` zeroings run as one batch of the layer (or in chunks of about ``internal_batch_size`` rows).
    """
    x, reference = tr.block_in[layer], tr.block_out[layer]
    B, T, _ = x.shape
    per_chunk = T if internal_batch_size is None else max(1, min(T, int(internal_batch_size) // B))
    columns: List[Tensor] = []
    for start in range(0, T, per_chunk):
        positions = torch.arange(start, min(T, start + per_chunk), device=x.device)
        n = positions.numel()
        keep = torch.ones(B * n, T, 1, dtype=tr.values[layer].dtype, device=x.device)
        keep[torch.arange(B * n, device=x.device), positions.repeat(B)] = 0.0
        out = rerun_layer(tr, layer, x.repeat_interleave(n, dim=0), n, value_edit=lambda v: v * keep.to(v.dtype))
        distance = (1.0 - torch.cosine_similarity(out.view(B, n, T, -1), reference.unsqueeze(1), dim=-1)).clamp_min(0)
        columns.append(distance.transpose(1, 2))  # [B, T (query i), n (zeroed j)]
    return torch.cat(columns, dim=2)


@register_method("value_zeroing", resolves_target=True)
def value_zeroing(model: Any, batch: Batch, target: Any = None, *, create_graph: bool = False,
                  layer: Optional[int] = None, internal_batch_size: Optional[int] = None) -> Tensor:
    """``[B, T]`` Mohebbi et al.'s value-zeroing scores of the classifier's summary row.

    ``C^l_{ij} = 1 − cos(x^l_i, x̃^l_{i, j zeroed})``, rows normalised to sum 1 over non-pad positions. Supports the
    BERT family (BERT, RoBERTa, MiniLM, ELECTRA), DistilBERT and the Llama family (a decoder's causal mask makes
    ``C_{ij} = 0`` for ``j > i``).

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: only validated.
        create_graph: keep the graph.
        layer: ``None`` (default): the summary row of the rollout ``C^L ⋯ C^1``; an int: that layer's ``C^l`` row.
        internal_batch_size: at most about this many zeroed copies of the batch rows per forward of a layer
            (``None``: all ``B·T`` at once).

    Example (DistilBERT):
        >>> import torch
        >>> from transformers import DistilBertConfig, DistilBertForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> _ = torch.manual_seed(0)
        >>> net = DistilBertForSequenceClassification(DistilBertConfig(
        ...     vocab_size=30, dim=8, n_layers=2, n_heads=2, hidden_dim=16, attn_implementation="eager"))
        >>> ids = torch.tensor([[2, 7, 8, 3]])
        >>> batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": (ids != 2) & (ids != 3)}
        >>> scores = attribute(HuggingFaceAdapter(net.eval()), batch, "value_zeroing")
        >>> scores.shape, bool((scores[0, 1:3] > 0).all()), bool(scores.sum() < 1)
        (torch.Size([1, 4]), True, True)
    """
    with nullcontext() if create_graph else torch.no_grad():
        tr, present, rows, layers = traced_layers(model, batch, target, layer)
        matrices = [normalise_rows(value_zeroing_matrix(tr, index, internal_batch_size), present) for index in layers]
        return rollout_rows(matrices, rows)

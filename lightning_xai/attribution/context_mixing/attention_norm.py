"""``"attention_norm"``: the norm of each token's weighted, transformed value vector (Kobayashi et al., 2020).

Kobayashi, Kuribayashi, Yokoi & Inui, "Attention is Not Only a Weight: Analyzing Transformers with Vector Norms"
(EMNLP 2020). Layer ``l``'s output at the summary position ``q`` is ``Σ_j Σ_h α^h_{qj} f^h(x_j) + b_O`` with
``f^h(x) = (x W_V^h + b_V^h) W_O^h``; token ``j``'s score is ``‖Σ_h α^h_{qj} f^h(x_j)‖₂`` — the attention weight
scaled by the size of what it moves.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch
from lightning_xai.attribution.context_mixing._hf_internals import (
    UNSHARDABLE,
    layer_index,
    mix_vectors,
    query_positions,
    trace,
)
from lightning_xai.attribution.core import resolve_target
from lightning_xai.attribution.registry import register_method

__all__ = ["attention_norm"]


@register_method("attention_norm", resolves_target=True, unshardable=UNSHARDABLE)
def attention_norm(
    model: Any, batch: Batch, target: Any = None, *, create_graph: bool = False, layer: int = -1
) -> Tensor:
    """``[B, T]`` Kobayashi et al.'s ‖Σ_h α^h_{qj} f^h(x_j)‖ at the summary row ``q`` of one layer.

    ``f^h(x) = (x W_V^h + b_V^h) W_O^h`` is head ``h``'s value vector mapped by its slice of the output projection
    (``b_O`` excluded: it does not depend on ``j``). ``q`` is the row the classifier pools (``[CLS]`` = 0 for the
    BERT family; ``extras["query_positions"]`` when the adapter reports it). Supports the BERT family (BERT,
    RoBERTa, MiniLM, ELECTRA), DistilBERT and the Llama family (grouped-query heads included).

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: only validated (the map does not depend on the class).
        create_graph: keep the graph (differentiable w.r.t. the parameters).
        layer: which attention layer (default ``-1``, the last).

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> _ = torch.manual_seed(0)
        >>> config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        ...                     intermediate_size=16, max_position_embeddings=16, attn_implementation="eager")
        >>> adapter = HuggingFaceAdapter(BertForSequenceClassification(config).eval())
        >>> batch = {"input_ids": torch.tensor([[2, 7, 8, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
        ...          "mask": torch.tensor([[False, True, True, False]])}
        >>> scores = attribute(adapter, batch, "attention_norm", layer=0)
        >>> scores.shape, bool((scores[0, 1:3] > 0).all()), scores[0, 0].item()
        (torch.Size([1, 4]), True, 0.0)
    """
    with nullcontext() if create_graph else torch.no_grad():
        tr = trace(model, batch)
        resolve_target(tr.output.logits, target)
        index = layer_index(layer, len(tr.parts))
        values = tr.values[index]
        rows = query_positions(model, tr.output, values.shape[0], values.shape[1], values.device)
        return mix_vectors(tr.parts[index], values, tr.attentions[index], rows=rows).norm(dim=-1)

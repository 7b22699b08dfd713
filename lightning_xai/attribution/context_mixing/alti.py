"""``"alti"``: Aggregation of Layer-wise Token-to-token Interactions (Ferrando, Gállego & Costa-jussà, 2022).

"Measuring the Mixing of Contextual Information in the Transformer" (EMNLP 2022). The attention block's output at
position ``i`` is decomposed into one vector per input token ``j``:

* ``z_{ij} = Σ_h α^h_{ij} f^h(x_j) + δ_{ij} x_j`` (heads, with ``f^h(x) = (x W_V^h + b_V^h) W_O^h``, plus the
  residual connection), so that ``Σ_j z_{ij} + b_O`` is the residual sum;
* **post-LN** (BERT family, DistilBERT): the layer norm ``LN(s) = γ ⊙ (s − μ(s)) / σ(s) + β`` is linear in ``s`` once
  ``σ_i = σ(s_i)`` is fixed, so ``T_i(x_j) = γ ⊙ (z_{ij} − μ(z_{ij})) / σ_i``; **pre-norm** (Llama family):
  ``T_i(x_j) = z_{ij}`` (the norm acts on the values' inputs, inside ``f^h``).

``y_i`` is the block's actual output (the LN output for post-LN, the residual sum for pre-norm; biases included) and
the contribution is the Manhattan-distance rule ``c_{ij} = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``, each row divided
by its sum. Layers are rolled out without an added identity (the residual is inside ``c``): ``R = C^L ⋯ C^1``.
The decomposition is checked against the module's own outputs before any contribution is trusted.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Optional

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ProtocolError
from lightning_xai.attribution.context_mixing._hf_internals import (
    UNSHARDABLE,
    Trace,
    mix_vectors,
    normalise_rows,
    rollout_rows,
    traced_layers,
)
from lightning_xai.attribution.registry import register_method

__all__ = ["alti", "alti_transformed_vectors", "alti_matrix"]


def _check(name: str, rebuilt: Tensor, actual: Tensor, present: Tensor) -> None:
    gap = (rebuilt - actual).abs()[present].max()
    scale = actual.abs()[present].max().clamp_min(1.0)
    if gap > 1e-4 * scale:
        raise ProtocolError(
            f"ALTI's decomposition of the attention block does not add up to the module's own "
            f"{name} (max difference {gap.item():.3g}); this layer's forward is not the "
            "residual + attention (+ LayerNorm) block ALTI decomposes."
        )


def alti_transformed_vectors(tr: Trace, layer: int, present: Tensor) -> tuple:
    """``(T, y)``: ``T_i(x_j)`` ``[B, T, T, D]`` and the block outputs ``y_i`` ``[B, T, D]`` of one layer."""
    parts, x = tr.parts[layer], tr.block_in[layer]
    z = mix_vectors(parts, tr.values[layer], tr.attentions[layer])
    z = z + torch.diag_embed(x.transpose(1, 2)).permute(0, 2, 3, 1)  # + δ_ij x_j
    residual_sum = tr.out_proj[layer] + x
    bias = parts.out.bias if parts.out.bias is not None else torch.zeros_like(x[0, 0])
    _check("residual sum", z.sum(2) + bias, residual_sum, present)
    norm = parts.norm_after
    if norm is None:
        return z, residual_sum
    if not isinstance(norm, nn.LayerNorm):
        raise ProtocolError(f"ALTI decomposes nn.LayerNorm; this block's norm is {type(norm).__name__}.")
    sigma = (residual_sum.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # [B, T, 1]
    gamma = norm.weight if norm.weight is not None else torch.ones_like(x[0, 0])
    beta = norm.bias if norm.bias is not None else torch.zeros_like(x[0, 0])
    transformed = gamma * (z - z.mean(-1, keepdim=True)) / sigma.unsqueeze(2)
    y = tr.norm_out[layer]
    if y is None:
        raise ProtocolError(
            f"ALTI: the LayerNorm after layer {layer}'s attention did not run in the traced forward, "
            "so there is no block output to decompose."
        )
    _check("LayerNorm output", transformed.sum(2) + gamma * (bias - bias.mean()) / sigma + beta, y, present)
    return transformed, y


def alti_matrix(tr: Trace, layer: int, present: Tensor) -> Tensor:
    """``[B, T, T]`` row-normalised ALTI contributions ``c_{ij}`` of one layer."""
    transformed, y = alti_transformed_vectors(tr, layer, present)
    y_norm = y.abs().sum(-1, keepdim=True)  # [B, T, 1]
    distance = (y.unsqueeze(2) - transformed).abs().sum(-1)  # [B, T, T]
    return normalise_rows((y_norm - distance).clamp_min(0.0), present)


@register_method("alti", resolves_target=True, unshardable=UNSHARDABLE)
def alti(
    model: Any, batch: Batch, target: Any = None, *, create_graph: bool = False, layer: Optional[int] = None
) -> Tensor:
    """``[B, T]`` ALTI contributions of each token to the classifier's summary row (Ferrando et al. 2022).

    Supports the BERT family (BERT, RoBERTa, MiniLM, ELECTRA) and DistilBERT (post-LN), and the Llama family
    (pre-norm). Memory: ``[B, T, T, hidden]`` per layer.

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: only validated.
        create_graph: keep the graph.
        layer: ``None`` (default): the rollout ``C^L ⋯ C^1``; an int: that layer's contributions.

    Example (a Llama-architecture classifier, pooled at its last position):
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> torch.manual_seed(0) and None
        >>> config = LlamaConfig(vocab_size=30, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        ...                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
        >>> adapter = HuggingFaceAdapter(LlamaForSequenceClassification(config).eval(), query_index=-1)
        >>> ids = torch.tensor([[5, 7, 8, 9]])
        >>> scores = attribute(adapter, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
        ...                              "mask": torch.ones_like(ids, dtype=torch.bool)}, "alti")
        >>> scores.shape, bool((scores >= 0).all()), round(scores.sum().item(), 6)
        (torch.Size([1, 4]), True, 1.0)
    """
    with nullcontext() if create_graph else torch.no_grad():
        tr, present, rows, layers = traced_layers(model, batch, target, layer)
        return rollout_rows([alti_matrix(tr, index, present) for index in layers], rows)

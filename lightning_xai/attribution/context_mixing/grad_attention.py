"""``"grad_attention"``: gradient-weighted attention rolled out (Chefer, Gur & Wolf, 2021).

"Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers" (ICCV 2021),
the self-attention rule: ``R = I``; for each layer, first to last, ``Ā = E_h[(∇_A s ⊙ A)^+]`` and
``R ← R + Ā R``, where ``A`` are the layer's attention probabilities and ``s`` the explained score (the target
logit by default, as in the authors' code). The map is the summary row of ``R``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch
from lightning_xai.attribution.context_mixing._hf_internals import adapter_model, query_weights
from lightning_xai.attribution.core import resolve_target, target_score
from lightning_xai.attribution.registry import register_method

__all__ = ["grad_attention"]


@register_method("grad_attention", resolves_target=True)
def grad_attention(
    model: Any, batch: Batch, target: Any = None, *, create_graph: bool = False, output: str = "logit"
) -> Tensor:
    """``[B, T]`` Chefer et al.'s relevance ``R[q, :]`` with ``R = Π_l (I + E_h[(∇A ⊙ A)^+])`` (last layer left).

    Needs only the raw attention maps, so it supports every family the adapter runs with eager attention (BERT
    family, DistilBERT, Llama family, ...).

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: the explained class (default: predicted).
        create_graph: keep the graph (second-order: the map is differentiable w.r.t. the parameters).
        output: the differentiated score, ``"logit"`` (default), ``"probability"`` or ``"log_probability"``.

    Example (ELECTRA):
        >>> import torch
        >>> from transformers import ElectraConfig as Config, ElectraForSequenceClassification as Classifier
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> _ = torch.manual_seed(1)
        >>> model = HuggingFaceAdapter(Classifier(Config(vocab_size=30, embedding_size=8, hidden_size=8,
        ...     num_hidden_layers=2, num_attention_heads=2, intermediate_size=16, attn_implementation="eager")).eval())
        >>> tokens = {"input_ids": torch.tensor([[2, 9, 4, 3]]), "attention_mask": torch.tensor([[1, 1, 1, 1]])}
        >>> tokens["mask"] = torch.tensor([[False, True, True, False]])
        >>> relevance = attribute(model, tokens, "grad_attention", target=1)
        >>> relevance.shape, bool((relevance >= 0).all())
        (torch.Size([1, 4]), True)
    """
    adapter_model(model)
    embeddings = model.embed(batch)
    if not embeddings.requires_grad:
        embeddings = embeddings.detach().requires_grad_(True)
    out = model.forward_from_embeddings(embeddings, batch)
    target = resolve_target(out.logits, target)
    raw = out.raw_attentions
    if not raw:
        raise ValueError(
            f"{type(model).__name__} returned no raw attention maps; grad_attention needs eager attention."
        )
    score = target_score(out.logits, target, output).sum()
    grads = torch.autograd.grad(score, raw, create_graph=create_graph)
    B, _, T, _ = raw[0].shape
    relevance = torch.eye(T, dtype=raw[0].dtype, device=raw[0].device).expand(B, T, T)
    for attention, grad in zip(raw, grads):
        cam = (grad * attention).clamp_min(0.0).mean(dim=1)
        relevance = relevance + cam @ relevance
    weights = query_weights(model, out, B, T, relevance.device).to(relevance.dtype)
    return torch.einsum("bq,bqk->bk", weights, relevance)

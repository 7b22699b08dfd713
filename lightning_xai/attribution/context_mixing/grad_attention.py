"""``"grad_attention"``: gradient-weighted attention rolled out (Chefer, Gur & Wolf, 2021).

"Generic Attention-model Explainability for Interpreting Bi-Modal and Encoder-Decoder Transformers" (ICCV 2021),
the self-attention rule: ``R = I``; for each layer, first to last, ``Ā = E_h[(∇_A s ⊙ A)^+]`` and
``R ← R + Ā R``, where ``A`` are the layer's attention probabilities and ``s`` the explained score (the target
logit by default, as in the authors' code). The map is the summary row of ``R``.

On a causal LM (a decoder-only generator, whose attention is self-attention), the same rule runs with ``s`` the
log-probability of the target (summed over its steps, or one step's, ``target=k``), and the map is the sum of the
explained steps' query rows of ``R`` over the prompt (step ``k``'s token is read at position ``s_k − 1``, as the
adapter's step attention is). An encoder–decoder needs the paper's cross-attention rules and is refused by name.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import TargetSequence
from lightning_xai.adapters.protocol import Batch, ProtocolError
from lightning_xai.attribution.context_mixing._hf_internals import adapter_model, query_weights
from lightning_xai.attribution.core import resolve_target, target_score
from lightning_xai.attribution.registry import register_method

__all__ = ["grad_attention"]


@register_method("grad_attention", resolves_target=True)
def grad_attention(
    model: Any, batch: Batch, target: Any = None, *, create_graph: bool = False, output: Optional[str] = None
) -> Tensor:
    """``[B, T]`` Chefer et al.'s relevance ``R[q, :]`` with ``R = Π_l (I + E_h[(∇A ⊙ A)^+])`` (last layer left).

    Needs only the raw attention maps, so it supports every family the adapter runs with eager attention (BERT
    family, DistilBERT, Llama family, ...).

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: the explained class (default: predicted); for a causal LM, the target step (default: the whole
            target).
        create_graph: keep the graph (second-order: the map is differentiable w.r.t. the parameters).
        output: the differentiated score, ``"logit"`` (default for a classifier), ``"probability"`` or
            ``"log_probability"`` (default for a causal LM).

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
    if isinstance(model, TargetSequence):
        return _causal_lm_grad_attention(model, batch, target, create_graph, output)
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
    score = target_score(out.logits, target, "logit" if output is None else output).sum()
    relevance = _relevance(raw, torch.autograd.grad(score, raw, create_graph=create_graph))
    B, T = relevance.shape[:2]
    weights = query_weights(model, out, B, T, relevance.device).to(relevance.dtype)
    return torch.einsum("bq,bqk->bk", weights, relevance)


def _relevance(raw: Sequence[Tensor], grads: Sequence[Tensor]) -> Tensor:
    """``[B, T, T]`` Chefer et al.'s ``R = Π_l (I + E_h[(∇A ⊙ A)^+])``, layers first to last."""
    B, _, T, _ = raw[0].shape
    relevance = torch.eye(T, dtype=raw[0].dtype, device=raw[0].device).expand(B, T, T)
    for attention, grad in zip(raw, grads):
        cam = (grad * attention).clamp_min(0.0).mean(dim=1)
        relevance = relevance + cam @ relevance
    return relevance


def _causal_lm_grad_attention(
    model: Any, batch: Batch, target: Any, create_graph: bool, output: Optional[str]
) -> Tensor:
    """The self-attention rule on a causal LM: the explained steps' query rows of ``R`` summed, ``s`` = log p."""
    if not getattr(model, "causal", False):
        inner = getattr(model, "model", model)
        raise ProtocolError(
            f"grad_attention does not explain encoder–decoders: {type(inner).__name__} reads the source through "
            "cross-attention, which Chefer et al.'s bi-modal rules (normalised self-attention relevances mixed "
            "through each cross-attention layer) would need; only their self-attention rule is implemented, for "
            "classifiers and causal LMs. Use 'attention', a gradient method, 'integrated_gradients', 'smooth_grad' "
            "or 'leave_one_out'."
        )
    embeddings = model.embed(batch)
    if not embeddings.requires_grad:
        embeddings = embeddings.detach().requires_grad_(True)
    out = model.forward_from_embeddings(embeddings, batch)
    chosen = resolve_target(out, target)
    score = target_score(out, chosen, output).sum()
    raw = out.raw_attentions
    relevance = _relevance(raw, torch.autograd.grad(score, raw, create_graph=create_graph))
    steps = out.target_steps.to(relevance.device)  # [B, K]: the steps a row has
    K = steps.shape[1]
    picked = chosen.to(relevance.device).view(-1, 1)
    explained = steps & ((picked < 0) | (torch.arange(K, device=steps.device) == picked))
    queries = out.extras["step_queries"].to(relevance.device)  # [B, K]: where each step's token is read
    rows = relevance.gather(1, queries[..., None].expand(-1, -1, relevance.shape[2]))  # [B, K, T]
    return (rows * explained[..., None].to(rows.dtype)).sum(1)

"""``"attnlrp"``: attention-aware layer-wise relevance propagation (Achtibat et al., 2024), in one backward pass.

Achtibat, Hatefi, Dreyer, Jain, Wiegand, Lapuschkin & Samek, "AttnLRP: Attention-Aware Layer-Wise Relevance
Propagation for Transformers" (ICML 2024). Relevance is gradient × input of a *modified* backward pass (the
"efficient" formulation of the authors' LXT library): every rule is written as a surrogate whose gradient is the
rule and whose forward value is the model's own, ``value.detach() + surrogate − surrogate.detach()``, so the logits
are bit-identical to the model's. The surrogates are put in place by forward hooks on the model's own modules,
removed when the pass ends (no modeling file is copied or changed):

* **elementwise nonlinearities** (GELU, SiLU, tanh, ...: the activation modules): identity rule,
  ``x · stopgrad(f(x)/x)`` — all of ``f(x)``'s relevance goes to ``x``;
* **layer norm / RMS norm**: the standard deviation (RMS) is a constant, ``(x − mean x) / stopgrad(σ) · w + b``
  (the mean-centering is linear and passes relevance as it is);
* **attention** ``softmax(q kᵀ / √d + m) · V``: the uniform rule on both matrix products — half of the output's
  relevance to ``A``, half to ``V``, and the scores' half split equally over ``q`` and ``k`` (the gradients at the
  query, key and value projections are scaled by 1/4, 1/4 and 1/2; linear maps in between such as rotary
  embeddings do not change the split). Through the softmax the AttnLRP rule ``R_i = x_i (R'_i − s_i Σ_j R'_j)``
  is gradient × input itself (its Taylor bias term absorbs the rest), so the softmax keeps its own gradient;
* **gated MLP** ``down(act(gate(x)) ⊙ up(x))``: uniform rule on the product (half of its relevance to each factor);
* the classification head's ``dense → tanh → out_proj`` (RoBERTa's functional tanh): identity rule.

The map is ``Σ_e E_{t,e} · ∂̃f/∂E_{t,e}`` at the input word embeddings ``E`` (what
:meth:`~lightning_xai.adapters.HuggingFaceAdapter.embed` returns) for the target logit ``f``.

**Conservation.** Relevance leaves the tokens only through the terms that act as biases: the model's bias
parameters (``b · g`` at every biased Linear / LayerNorm output), the position and token-type embeddings of the
BERT family, and the softmax rule's Taylor bias, ``½ Σ_i (Σ_j A_ij g_ij − Σ_j x_ij A_ij (g_ij − Σ_k A_ik g_ik))`` per
attention row ``i`` (``x = log A`` up to a per-row constant, ``g``: the gradient at ``A``; the ½ is the uniform
rule's share of ``A``). ``return_convergence_delta=True`` returns ``(relevance, delta)`` with
``delta = Σ_t R_t − (f − bias terms)`` per row (like Integrated Gradients' delta): ``≈ 0`` up to float rounding
when every rule conserves relevance, on models with biases as on bias-free ones. On a bias-free model the softmax
term (and the BERT family's position embeddings) remain: even there ``Σ_t R_t ≠ f`` — as in the paper, the softmax
rule is not conservative by itself. :func:`attnlrp_absorbed` returns the three parts.

Checked against LXT 2.1's efficient AttnLRP (Llama and BERT patches, transformers 4.51) on the same tiny weights:
the token maps agree to ``5e-9`` (float64; the Llama softmax runs in float32 in both).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.huggingface.families import FAMILIES
from lightning_xai.adapters.protocol import Batch, ProtocolError
from lightning_xai.attribution.context_mixing._attnlrp_rules import BiasTerm, attnlrp_rules
from lightning_xai.attribution.context_mixing._hf_internals import adapter_model
from lightning_xai.attribution.core import resolve_target, target_score
from lightning_xai.attribution.registry import SCORES_AND_DELTA, register_method

__all__ = ["ATTNLRP_FAMILIES", "attnlrp", "attnlrp_absorbed"]

#: ``config.model_type`` values AttnLRP runs on -> their family: the family table's entries with ``attnlrp=True``
#: (:mod:`lightning_xai.adapters.huggingface.families`): the BERT family and DistilBERT (post-LN encoders with separate
#: query/key/value projections) and the Llama family (pre-RMSNorm decoders with q/k/v projections and a gated MLP;
#: Gemma's ``(1 + w)`` RMS norm included).
ATTNLRP_FAMILIES: Dict[str, str] = {
    name: {"bert": "BERT family", "distilbert": "DistilBERT", "llama": "Llama family"}[family.layout.name]
    for name, family in FAMILIES.items()
    if family.attnlrp and family.layout is not None
}


def _check_family(net: nn.Module) -> str:
    model_type = getattr(getattr(net, "config", None), "model_type", None)
    if model_type not in ATTNLRP_FAMILIES:
        encoders = ", ".join(k for k, v in ATTNLRP_FAMILIES.items() if v != "Llama family")
        decoders = ", ".join(k for k, v in ATTNLRP_FAMILIES.items() if v == "Llama family")
        raise ProtocolError(
            f"attnlrp supports the BERT family ({encoders}) and the Llama family ({decoders}); "
            f"{type(net).__name__} (model_type={model_type!r}) is not one of them: its attention or MLP needs rules "
            "this implementation does not have (fused qkv / gate-up projections in GPT-2 and Phi-3, DeBERTa's "
            "disentangled attention, ALBERT's shared layers, ModernBERT's fused Wqkv). Use 'grad_x_input' or "
            "'integrated_gradients' for it."
        )
    return ATTNLRP_FAMILIES[model_type]


def _softmax_bias(attentions: Tuple[Tensor, ...], grads: Tuple[Tensor, ...]) -> Tensor:
    """``[B]``: relevance the softmax rule's Taylor bias absorbs, summed over layers, heads and query rows."""
    total = torch.zeros(attentions[0].shape[0], dtype=attentions[0].dtype, device=attentions[0].device)
    for a, g in zip(attentions, grads):
        if g is None:
            continue
        a = a.to(g.dtype)
        incoming = (a * g).sum(-1, keepdim=True)  # Σ_j A_j g_j per row
        through = (torch.xlogy(a, a) * (g - incoming)).sum(-1)  # x_j = log A_j + const; the const cancels
        total = total + 0.5 * (incoming.squeeze(-1) - through).sum(dim=(1, 2)).to(total.dtype)
    return total


def _bias_relevance(terms: List[BiasTerm], grads: Tuple[Any, ...], like: Tensor) -> Tensor:
    """``[B]``: ``Σ b · g`` over every recorded bias term (a whole tensor where the bias is ``None``)."""
    total = torch.zeros_like(like)
    for (tensor, bias), grad in zip(terms, grads):
        if grad is None:
            continue
        share = grad * (tensor if bias is None else bias.to(grad.dtype))
        total = total + share.reshape(share.shape[0], -1).sum(-1).to(total.dtype)
    return total


def _relevance_pass(
    model: Any, batch: Batch, target: Any, create_graph: bool, account: bool
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(relevance [B, T], target logit [B], absorbed [B])``; ``absorbed`` is 0 unless ``account``."""
    net = adapter_model(model)
    _check_family(net)
    embeddings = model.embed(batch)
    if not embeddings.requires_grad:
        embeddings = embeddings.detach().requires_grad_(True)
    terms: Optional[List[BiasTerm]] = [] if account else None
    with attnlrp_rules(net, terms, batch_size=embeddings.shape[0]):
        out = model.forward_from_embeddings(embeddings, batch)
    target = resolve_target(out.logits, target)
    score = target_score(out.logits, target, "logit")
    terms = [t for t in terms or [] if t[0].requires_grad]
    attentions = tuple(a for a in (out.raw_attentions or ()) if a.requires_grad) if account else ()
    inputs = [embeddings, *(t for t, _ in terms), *attentions]
    grads = torch.autograd.grad(score.sum(), inputs, create_graph=create_graph, allow_unused=True)
    relevance = (embeddings * grads[0]).sum(-1)
    if not create_graph:
        relevance = relevance.detach()
    absorbed = torch.zeros_like(score)
    if account:
        absorbed = _bias_relevance(terms, grads[1 : 1 + len(terms)], score)
        if attentions:
            absorbed = absorbed + _softmax_bias(attentions, grads[1 + len(terms) :])
    return relevance, score, absorbed


def attnlrp_absorbed(model: Any, batch: Batch, target: Any = None) -> Tuple[Tensor, Tensor, Tensor]:
    """``(Σ_t R_t, f, absorbed)``, each ``[B]``: token relevance, target logit, and the bias terms' relevance.

    Conservation holds when ``Σ_t R_t + absorbed == f`` (up to float rounding).

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> _ = torch.manual_seed(0)
        >>> net = LlamaForSequenceClassification(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
        ...     attn_implementation="eager")).double().eval()
        >>> ids = torch.tensor([[5, 9, 12, 7]])
        >>> batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": torch.ones_like(ids).bool()}
        >>> tokens, logit, absorbed = attnlrp_absorbed(HuggingFaceAdapter(net), batch, target=1)
        >>> bool(torch.allclose(tokens + absorbed, logit, atol=1e-10))
        True
    """
    relevance, score, absorbed = _relevance_pass(model, batch, target, False, account=True)
    return relevance.sum(-1).detach(), score.detach(), absorbed.detach()


@register_method("attnlrp", resolves_target=True, returns=SCORES_AND_DELTA)
def attnlrp(
    model: Any, batch: Batch, target: Any = None, *, create_graph: bool = False, return_convergence_delta: bool = False
) -> Any:
    """``[B, T]`` AttnLRP relevance of the target logit at the input word embeddings (summed over the embedding).

    Supports the BERT family (BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, MiniLM), DistilBERT and the Llama family
    (Llama, Qwen2, Mistral, Qwen3, Gemma); any other ``model_type`` is refused by name (:data:`ATTNLRP_FAMILIES`).

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: the explained class (default: predicted).
        create_graph: keep the graph (the map is then differentiable w.r.t. the parameters).
        return_convergence_delta: also return ``delta`` ``[B]``: ``Σ_t R_t − (f − bias terms)`` (see the module
            docstring; ``≈ 0``).

    Returns:
        The ``[B, T]`` map, or ``(map, delta)``.

    Example (a bias-free tiny BERT, biases zeroed):
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> _ = torch.manual_seed(0)
        >>> net = BertForSequenceClassification(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2,
        ...     num_attention_heads=2, intermediate_size=16, attn_implementation="eager")).double().eval()
        >>> ids = torch.tensor([[2, 7, 8, 3]])
        >>> batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": (ids != 2) & (ids != 3)}
        >>> relevance, delta = attribute(HuggingFaceAdapter(net), batch, "attnlrp", target=0,
        ...                              return_convergence_delta=True)
        >>> relevance.shape, bool(delta.abs().max() < 1e-8)
        (torch.Size([1, 4]), True)
    """
    relevance, score, absorbed = _relevance_pass(model, batch, target, create_graph, return_convergence_delta)
    if not return_convergence_delta:
        return relevance
    delta = relevance.sum(-1) - (score - absorbed)
    return relevance, delta.detach() if not create_graph else delta

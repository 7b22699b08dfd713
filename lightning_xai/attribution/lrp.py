"""Layer-wise relevance propagation (LRP) for (Bi)LSTM / MLP + attention classifiers.

The relevance of the target logit is propagated backwards layer by layer with rules that keep (almost) all
of it, until it reaches the input embeddings; a token's relevance is the sum over its embedding dimensions.

Rules (Arras, Montavon, Müller & Samek 2017, "Explaining recurrent neural network predictions in sentiment
analysis", and their reference code ``LRP_for_LSTM``):

* **Linear layers (classifier, LSTM pre-activations, MLP projection) — LRP-ε.** For ``z_i = Σ_j x_j w_ij + b_i``
  the relevance of input ``j`` is ``Σ_i (x_j w_ij + β·(b_i + ε·sign(z_i))/N) / (z_i + ε·sign(z_i)) · R_i``
  with ``sign(0) = +1``, ``N`` the number of (present) inputs and ``β = bias_factor``. With ``β = 0`` (the
  default, as in Arras et al.) the bias and the stabiliser ε *absorb* their share of relevance; with ``β = 1``
  it is spread evenly over the inputs and relevance is conserved exactly.
* **Embedding layer.** A lookup is a linear layer on a one-hot input with a single active unit, so the
  ε-rule hands that unit everything: the token's relevance is the sum of its embedding dimensions'.
* **Element-wise activations (tanh of the cell candidate, of the cell, the MLP's tanh).** Identity rule:
  the relevance passes unchanged.
* **Gated products — signal-take-all.** In ``h_t = o_t ⊙ tanh(c_t)`` all of ``R(h_t)`` goes to the cell ``c_t``;
  in ``c_t = f_t ⊙ c_{t-1} + i_t ⊙ g_t`` the relevance of ``c_t`` is split between ``c_{t-1}`` and the cell
  candidate ``g_t`` in proportion to ``f_t c_{t-1}`` and ``i_t g_t`` (ε-rule). The gates ``i, f, o`` receive no
  relevance: they only decide how much of the signal passes.
* **Attention — treated as a gate.** The weights α are held fixed (the scorer that produced them gets no
  relevance), so the context ``c = Σ_t α_t h_t`` is a linear layer with weights α: the relevance of context
  unit ``j`` flows to ``h_{t,j}`` in proportion to ``α_t h_{t,j}`` (ε-rule, no bias).

The LSTM is re-run in Python from the ``nn.LSTM`` weights (gates in PyTorch's order i, f, g, o; both
directions; each direction starts from a zero state at its first real position, exactly like the packed
sequence the model runs), and the re-run hidden states are checked against the model's own before any
relevance is trusted.

**Conservation.** ``return_convergence_delta=True`` also returns ``Σ_t R_t − logit_target`` per example, like
Integrated Gradients' delta. With ``bias_factor=1`` every rule conserves relevance exactly, so the delta is
float error plus the relevance that lands on positions outside the token mask (``<sos>``/``<eos>``, which the
encoder reads but which the returned map zeroes). With ``bias_factor=0`` the delta is minus the relevance
absorbed by all biases and by ε.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple, Type, Union

import torch
from torch import Tensor, nn

from lightning_xai.adapters.capabilities import LinearHead, TokenEncoder
from lightning_xai.adapters.protocol import Batch, as_explainable
from lightning_xai.attribution.lrp_rules import _safe_div, _sign, lrp_linear, lstm_forward, lstm_rule, per_token_rule
from lightning_xai.attribution.registry import SCORES_AND_DELTA, register_method
from lightning_xai.attribution.targets import resolve_target

__all__ = [
    "LRP_ENCODER_RULES",
    "EncoderRule",
    "lrp",
    "lrp_linear",
    "lstm_forward",
    "lstm_rule",
    "per_token_rule",
    "register_lrp_encoder",
]

EncoderRule = Callable[..., Tuple[Tensor, Tensor]]
"""``rule(encoder, x, input_mask, relevance_hidden, *, eps, bias_factor) -> (relevance_x, hidden)``.

``x`` ``[B, T, E]`` are the encoder's inputs, ``relevance_hidden`` ``[B, T, H]`` the relevance of its outputs;
the rule returns the relevance of ``x`` and the hidden states it recomputed (checked against the model's)."""

LRP_ENCODER_RULES: Dict[Type[nn.Module], EncoderRule] = {}


def register_lrp_encoder(encoder_type: Type[nn.Module]) -> Callable[[EncoderRule], EncoderRule]:
    """Register the LRP rule for an encoder class (looked up along the encoder's MRO).

    Example:
        >>> from lightning_xai.models.encoders import MLPEncoder
        >>> LRP_ENCODER_RULES[MLPEncoder] is per_token_rule
        True
    """

    def decorator(rule: EncoderRule) -> EncoderRule:
        LRP_ENCODER_RULES[encoder_type] = rule
        return rule

    return decorator


def _find_rule(encoder: nn.Module) -> Optional[EncoderRule]:
    for cls in type(encoder).__mro__:
        if cls in LRP_ENCODER_RULES:
            return LRP_ENCODER_RULES[cls]
    return None


def _unsupported(model: Any, why: str) -> ValueError:
    supported = ", ".join(sorted(cls.__name__ for cls in LRP_ENCODER_RULES))
    return ValueError(
        f"LRP does not support {type(model).__name__}: {why}. Supported: models with the LinearHead and "
        "TokenEncoder capabilities (lightning_xai.adapters.capabilities: embeddings -> token encoder -> attention "
        f"pooling -> nn.Linear head) whose encoder has a registered rule; registered: {supported}. Register a rule "
        "for another encoder with register_lrp_encoder, or use a gradient-based method (e.g. "
        "'integrated_gradients')."
    )


_REDUCED = (torch.float16, torch.bfloat16)


def _check_precision(model: Any, encoder: nn.Module, hidden: Tensor, logits: Tensor) -> None:
    """LRP checks its re-run of the encoder against the model's own hidden states: in half precision those are
    rounded by ~1e-3, so the check (and the relevances) would fail for precision, not for a missing rule."""
    reduced = next((t.dtype for t in (hidden, logits) if t.dtype in _REDUCED), None)
    if reduced is None:
        return
    raise ValueError(
        f"LRP needs {type(model).__name__}'s forward in float32 or float64, but its hidden states are {reduced} "
        "(a half-precision model, or autocast/mixed precision): the encoder's LRP rule "
        f"({type(encoder).__name__}) is re-run in float64 and checked against the model's own hidden states, which "
        f"{reduced} rounds by ~1e-3, so the relevances cannot be trusted. The cause is precision, not a missing "
        "rule: cast the model to float32 for LRP (model.float(), outside torch.autocast; Trainer(precision='32') "
        "for audits), or use a gradient-based method."
    )


def lrp(
    model: Any,
    batch: Batch,
    target: Optional[Union[int, Tensor]] = None,
    *,
    create_graph: bool = False,
    eps: float = 1e-3,
    bias_factor: float = 0.0,
    return_convergence_delta: bool = False,
    dtype: Optional[torch.dtype] = torch.float64,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Token relevance ``[B, T]`` of the ``target`` logit by LRP (rules in the module docstring).

    Args:
        model: an explainable model with the :class:`~lightning_xai.adapters.capabilities.LinearHead` and
            :class:`~lightning_xai.adapters.capabilities.TokenEncoder` capabilities whose encoder has a registered
            rule (the reference ``AttentionClassifier`` with an ``LSTMEncoder`` or ``MLPEncoder``).
        batch: a batch dict (``input_ids``, ``mask``, optional ``input_mask``).
        target: class index (int or ``[B]``); defaults to the predicted class.
        create_graph: keep the computation differentiable w.r.t. the parameters and embeddings.
        eps: the ε stabiliser of every ε-rule.
        bias_factor: 0 (Arras et al.'s default) lets biases and ε absorb relevance; 1 redistributes it so
            that relevance is conserved exactly.
        return_convergence_delta: also return ``Σ_t R_t − logit_target`` ``[B]``.
        dtype: the dtype relevance is propagated in (``None``: the model's). float64 by default: through long
            sequences LRP-ε relevances of single units can grow to ~10⁶ with opposite signs, and in float32 their
            cancellation costs the conservation check its precision. The map is returned in the model's dtype.

    Returns:
        ``[B, T]`` relevance (signed, 0 outside the token mask), and the delta when asked.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> relevance, delta = lrp(model, batch, bias_factor=1.0, return_convergence_delta=True)
        >>> relevance.shape, bool(delta.abs().max() < 1e-5)
        (torch.Size([2, 3]), True)
    """
    model = as_explainable(model)
    for capability in (LinearHead, TokenEncoder):
        if not isinstance(model, capability):
            raise _unsupported(model, f"it does not implement the {capability.__name__} capability")
    head, encoder = model.linear_head(), model.token_encoder()
    if not isinstance(head, nn.Linear):
        raise _unsupported(model, f"its linear_head() is {type(head).__name__}, not nn.Linear")
    rule = _find_rule(encoder)
    if rule is None:
        raise _unsupported(model, f"no LRP rule for its encoder {type(encoder).__name__}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}.")
    if not 0.0 <= bias_factor <= 1.0:
        raise ValueError(f"bias_factor must lie in [0, 1], got {bias_factor}.")
    batch = {k: v.clone() if isinstance(v, Tensor) else v for k, v in batch.items()}
    was_training = model.training
    model.eval()  # dropout off: the relevance must explain the deterministic prediction
    try:
        with torch.inference_mode(False), torch.set_grad_enabled(create_graph):
            embeddings = model.embed(batch)
            output = model.forward_from_embeddings(embeddings, batch)
            logits, alpha, hidden = output.logits, output.attention, output.hidden_states
            if hidden is None:
                raise _unsupported(model, "its forward does not return hidden_states")
            _check_precision(model, encoder, hidden, logits)
            token_mask = model.token_mask(batch)
            input_mask = model.input_mask(batch)
            target_index = resolve_target(logits, target)
            out_dtype = logits.dtype
            if dtype is not None:
                embeddings, logits, alpha, hidden = (t.to(dtype) for t in (embeddings, logits, alpha, hidden))
            # classifier: R(logit_target) = logit_target
            relevance_out = torch.zeros_like(logits)
            picked = logits.gather(1, target_index.unsqueeze(1))
            relevance_out = relevance_out.scatter(1, target_index.unsqueeze(1), picked)
            context = torch.einsum("bt,bth->bh", alpha, hidden)
            relevance_context = lrp_linear(
                context,
                head.weight.to(context.dtype),
                None if head.bias is None else head.bias.to(context.dtype),
                logits,
                relevance_out,
                eps=eps,
                bias_factor=bias_factor,
            )
            # attention pooling as a gate: c_j = Σ_t α_t h_tj
            attended = token_mask.to(hidden.dtype)
            stab = eps * _sign(context)
            count = attended.sum(1, keepdim=True).clamp_min(1).unsqueeze(-1)
            numer = alpha.unsqueeze(-1) * hidden + bias_factor * stab.unsqueeze(1) * attended.unsqueeze(-1) / count
            relevance_hidden = numer * _safe_div(relevance_context, context + stab).unsqueeze(1)
            relevance_x, recomputed = rule(
                encoder, embeddings, input_mask, relevance_hidden, eps=eps, bias_factor=bias_factor
            )
            scale = hidden.detach().abs().max().clamp_min(1.0)
            gap = (recomputed.detach() - hidden.detach()).abs().max()
            if gap > 1e-4 * scale:
                raise RuntimeError(
                    f"LRP's re-run of {type(encoder).__name__} disagrees with the model's own "
                    f"hidden states (max difference {gap.item():.3g}); the encoder's forward is not "
                    "the one its LRP rule implements. Register a matching rule."
                )
            relevance = relevance_x.sum(-1) * token_mask
            delta_full = relevance.sum(1) - picked.squeeze(1).to(relevance.dtype)
            relevance = relevance.to(out_dtype)
            if not create_graph:
                relevance = relevance.detach()
    finally:
        model.train(was_training)
    if return_convergence_delta:
        return relevance, delta_full.detach().to(out_dtype)
    return relevance


@register_method("lrp", resolves_target=True, returns=SCORES_AND_DELTA)
def _lrp_method(
    model: Any,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    eps: float = 1e-3,
    bias_factor: float = 0.0,
    return_convergence_delta: bool = False,
    dtype: Optional[torch.dtype] = torch.float64,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """``attribute(model, batch, method="lrp", eps=..., bias_factor=..., return_convergence_delta=..., dtype=...)``."""
    return lrp(
        model,
        batch,
        target,
        create_graph=create_graph,
        eps=eps,
        bias_factor=bias_factor,
        return_convergence_delta=return_convergence_delta,
        dtype=dtype,
    )

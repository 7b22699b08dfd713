"""Use a Captum attribution object (``method=captum.attr.Saliency(...)``) through :func:`attribute`.

Captum is never imported here: any object with an ``.attribute(inputs, target=..., additional_forward_args=...)``
method and a ``forward_func`` attribute works. Its forward function is swapped, for the duration of the call,
for one over input embeddings that returns class probabilities (or logits), and the ``[B, T, E]`` result is
reduced to ``[B, T]``. For a generation model the function returns one column, the explained score of each row's
target (:func:`~lightning_xai.attribution.targets.target_score`: a log-probability by default), and Captum's target
is that column; the resolved targets travel with the rows as an additional forward argument.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution.targets import OUTPUTS, resolve_target, score_values, target_score

__all__ = ["captum_attribute"]

CAPTUM_REDUCTIONS = ("sum", "l2", "abs_sum")


def _reduce(attributions: Any, reduction: str) -> Tensor:
    if isinstance(attributions, (tuple, list)):
        if len(attributions) != 1:
            raise ValueError(f"Expected one attribution tensor (inputs are the embeddings), got {len(attributions)}.")
        attributions = attributions[0]
    if attributions.dim() != 3:
        raise ValueError(f"Expected [B, T, E] attributions from the Captum method; got {tuple(attributions.shape)}.")
    if reduction == "sum":
        return attributions.sum(dim=-1)
    if reduction == "abs_sum":
        return attributions.abs().sum(dim=-1)
    return attributions.pow(2).sum(dim=-1).sqrt()


def _holders(method: Any) -> List[Any]:
    holders, seen = [], set()
    stack = [method]
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if hasattr(obj, "forward_func"):
            holders.append(obj)
        stack.append(getattr(obj, "attribution_method", None))
    return holders


def captum_attribute(
    model: ExplainableModel,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    captum_method: Any = None,
    output: Optional[str] = None,
    reduction: str = "sum",
    **captum_options: Any,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Run ``captum_method.attribute`` on the embeddings of ``batch`` and reduce over E (see :func:`attribute`)."""
    if create_graph:
        raise ValueError(
            "create_graph=True is not available for Captum attribution objects (Captum detaches its "
            "gradients); use a built-in method name such as 'gradient' or 'integrated_gradients'."
        )
    if output is not None and output not in OUTPUTS:
        raise ValueError(f"Unknown output {output!r}; choose one of {list(OUTPUTS)}.")
    if reduction not in CAPTUM_REDUCTIONS:
        raise ValueError(f"Unknown reduction {reduction!r}; choose one of {list(CAPTUM_REDUCTIONS)}.")
    if hasattr(captum_method, "layer") or hasattr(captum_method, "neuron"):
        raise TypeError(
            f"{type(captum_method).__name__} attributes to a layer/neuron; attribute() runs Captum on the "
            "input embeddings, so pass the input-space method (e.g. IntegratedGradients instead of "
            "LayerIntegratedGradients)."
        )
    holders = _holders(captum_method)
    if not holders:
        raise TypeError(f"{type(captum_method).__name__} has no forward_func; pass a Captum attribution object.")
    mask = model.token_mask(batch)
    B = mask.shape[0]
    with torch.no_grad():
        embeddings = model.embed(batch).detach()
        out = model.forward_from_embeddings(embeddings, batch)
        target = resolve_target(out, target)
    generation = getattr(out, "target_log_probs", None) is not None
    head = head_kind_of(model)
    classes = ("logit" if head == "regression" else "probability") if output is None else output
    if not generation:
        score_values(torch.zeros(1, 1), classes, head)  # a probability of a regression head: refused before Captum
    # per-example tensors travel as additional_forward_args so Captum expands them the way it expands inputs
    keys = [k for k, v in batch.items() if isinstance(v, Tensor) and v.dim() >= 1 and v.shape[0] == B]
    fixed: Dict[str, Any] = {k: v for k, v in batch.items() if k not in keys}
    values_in = tuple(batch[k] for k in keys) + ((target,) if generation else ())

    def forward(emb: Tensor, *values: Tensor) -> Tensor:
        sub = dict(fixed)
        sub.update(zip(keys, values))
        scored = model.forward_from_embeddings(emb, sub)
        if generation:  # one column: each row's explained log-probability (never a softmax over classes)
            return target_score(scored, values[-1], output).unsqueeze(1)
        return score_values(scored.logits, classes, head)

    saved = [(holder, holder.forward_func) for holder in holders]
    try:
        for holder, _ in saved:
            holder.forward_func = forward
        result = captum_method.attribute(
            embeddings,
            target=torch.zeros_like(target) if generation else target,
            additional_forward_args=values_in,
            **captum_options,
        )
    finally:
        for holder, func in saved:
            holder.forward_func = func
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[1], Tensor)
        and captum_options.get("return_convergence_delta", False)
    ):
        return _reduce(result[0], reduction), result[1]
    return _reduce(result, reduction)

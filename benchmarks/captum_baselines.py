"""Captum configured the way a user would for the same model and batch, computing the same quantity as ours.

Every forward function returns class *probabilities* (lightning_xai's default ``output="probability"``) and
the target is the predicted class, so Captum's and lightning_xai's maps are comparable number for number.
Captum's ``[B, T, E]`` attributions are reduced to tokens the way lightning_xai does (sum over E for IG and
grad×input, L2 / |·|-sum for gradients), and pads are zeroed.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

PER_EXAMPLE_SKIP = ("labels", "index")


def _split(batch: Dict[str, Any]) -> Tuple[Tuple[str, ...], Tuple[Tensor, ...]]:
    """Per-example tensors the forward needs besides ``input_ids`` (Captum repeats them along with the inputs)."""
    keys = tuple(
        k
        for k, v in batch.items()
        if isinstance(v, Tensor)
        and k not in PER_EXAMPLE_SKIP
        and k != "input_ids"
        and v.dim() >= 1
        and v.shape[0] == batch["input_ids"].shape[0]
    )
    return keys, tuple(batch[k] for k in keys)


def ids_forward(model, batch):
    """``f(input_ids, *extra) -> probabilities`` and the extra args, for Layer* methods on the embedding layer."""
    keys, extra = _split(batch)

    def forward(ids: Tensor, *values: Tensor) -> Tensor:
        sub = {"input_ids": ids, **dict(zip(keys, values))}
        return model.forward_from_embeddings(model.embed(sub), sub).logits.softmax(-1)

    return forward, extra


def embeddings_forward(model, batch):
    """``f(embeddings, *extra) -> probabilities`` and the extra args, for input-space methods on embeddings."""
    keys, extra = _split(batch)
    keys = ("input_ids",) + keys
    extra = (batch["input_ids"],) + extra

    def forward(emb: Tensor, *values: Tensor) -> Tensor:
        sub = dict(zip(keys, values))
        return model.forward_from_embeddings(emb, sub).logits.softmax(-1)

    return forward, extra


def embedding_layer(model):
    if hasattr(model, "embedding"):
        return model.embedding
    if hasattr(model, "_embedding"):
        return model._embedding
    return model.model.get_input_embeddings()


def layer_integrated_gradients(
    model,
    batch,
    target: Tensor,
    n_steps: int = 50,
    internal_batch_size: Optional[int] = None,
    method: str = "gausslegendre",
    pad_id: int = 0,
) -> Tensor:
    """Captum ``LayerIntegratedGradients`` on the embedding layer, baseline = pad ids (zero vector), ``[B, T]``."""
    from captum.attr import LayerIntegratedGradients

    forward, extra = ids_forward(model, batch)
    ids = batch["input_ids"]
    mask = model.token_mask(batch)
    baseline = torch.where(mask, torch.full_like(ids, pad_id), ids)
    lig = LayerIntegratedGradients(forward, embedding_layer(model))
    attr = lig.attribute(
        ids,
        baselines=baseline,
        target=target,
        additional_forward_args=extra,
        n_steps=n_steps,
        method=method,
        internal_batch_size=internal_batch_size,
    )
    return attr.sum(-1).masked_fill(~mask, 0.0).detach()


def feature_ablation(model, batch, target: Tensor, perturbations_per_eval: int = 1) -> Tensor:
    """Captum ``FeatureAblation`` on the embeddings, one feature per token position, baseline 0 (the pad vector).

    Captum ablates feature ``t`` in every row at once, so it runs ``T_max`` perturbed copies of the whole batch
    (``B × T_max`` rows, pads included). Returns |p(x) − p(x with token t zeroed)|, ``[B, T]``.
    """
    from captum.attr import FeatureAblation

    forward, extra = embeddings_forward(model, batch)
    with torch.no_grad():
        emb = model.embed(batch)
    B, T, E = emb.shape
    mask = model.token_mask(batch)
    feature_mask = torch.arange(T).view(1, T, 1).expand(B, T, E)
    ablation = FeatureAblation(forward)
    with torch.no_grad():
        attr = ablation.attribute(
            emb,
            baselines=0.0,
            target=target,
            additional_forward_args=extra,
            feature_mask=feature_mask,
            perturbations_per_eval=perturbations_per_eval,
        )
    return attr[..., 0].abs().masked_fill(~mask, 0.0)


def saliency(model, batch, target: Tensor, reduction: str = "l2") -> Tensor:
    from captum.attr import Saliency

    forward, extra = embeddings_forward(model, batch)
    emb = model.embed(batch).detach()
    grads = Saliency(forward).attribute(emb, target=target, additional_forward_args=extra, abs=False)
    out = grads.pow(2).sum(-1).sqrt() if reduction == "l2" else grads.abs().sum(-1)
    return out.masked_fill(~model.token_mask(batch), 0.0).detach()


def saliency_on(model, batch, target: Tensor, embeddings: Tensor) -> Tensor:
    """Captum ``Saliency`` at given (e.g. noisy) embeddings, L2 over E, pads zeroed."""
    from captum.attr import Saliency

    forward, extra = embeddings_forward(model, batch)
    grads = Saliency(forward).attribute(embeddings.detach(), target=target, additional_forward_args=extra, abs=False)
    return grads.pow(2).sum(-1).sqrt().masked_fill(~model.token_mask(batch), 0.0).detach()


def input_x_gradient(model, batch, target: Tensor) -> Tensor:
    from captum.attr import InputXGradient

    forward, extra = embeddings_forward(model, batch)
    emb = model.embed(batch).detach()
    attr = InputXGradient(forward).attribute(emb, target=target, additional_forward_args=extra)
    return attr.sum(-1).masked_fill(~model.token_mask(batch), 0.0).detach()


def noise_tunnel_saliency(
    model, batch, target: Tensor, stdevs: float, nt_samples: int = 30, nt_samples_batch_size: Optional[int] = None
) -> Tensor:
    """Captum ``NoiseTunnel(Saliency)`` smoothgrad; the map is the L2 norm over E of the mean gradient.

    Note: Captum's smoothgrad averages the *gradients* and lightning_xai's SmoothGrad averages the per-sample
    *maps*; for the L2 reduction they differ (‖mean g‖ vs mean ‖g‖). ``noise_tunnel_saliency_maps`` computes
    the mean of per-sample maps with Captum's gradients for a like-for-like numerical comparison.
    """
    from captum.attr import NoiseTunnel, Saliency

    forward, extra = embeddings_forward(model, batch)
    emb = model.embed(batch).detach()
    nt = NoiseTunnel(Saliency(forward))
    grads = nt.attribute(
        emb,
        nt_type="smoothgrad",
        nt_samples=nt_samples,
        stdevs=stdevs,
        target=target,
        additional_forward_args=extra,
        nt_samples_batch_size=nt_samples_batch_size,
        abs=False,
    )
    return grads.pow(2).sum(-1).sqrt().masked_fill(~model.token_mask(batch), 0.0).detach()

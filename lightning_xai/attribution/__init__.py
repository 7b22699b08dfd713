"""Saliency maps for any :class:`~lightning_xai.adapters.ExplainableModel` through one verb, :func:`attribute`.

Methods: ``attention``, ``gradient``, ``grad_x_input``, ``integrated_gradients``, ``smooth_grad``,
``leave_one_out``, ``smooth_attention``, ``integrated_hessians`` (:func:`integrated_hessians` gives its ``[B, T, T]``
pairwise interactions), any method registered with :func:`register_method`, or a Captum attribution object.
:func:`explanation_context` makes explanations safe inside ``trainer.validate``/``test`` and training steps;
:func:`shared_input_gradients` lets gradient and grad×input of the same inputs share one backward pass.
"""
from lightning_xai.attribution.batching import pad_embeddings, remove_tokens, gather_rows
from lightning_xai.attribution.context import clone_inference_tensors, explanation_context
from lightning_xai.attribution.core import (
    ATTRIBUTION_METHODS,
    attribute,
    check_method_options,
    check_token_mask,
    predicted_class,
    register_method,
    resolve_target,
    target_probabilities,
    target_score,
)
from lightning_xai.attribution.gradients import auto_internal_batch_size, shared_input_gradients
from lightning_xai.attribution.integrated_gradients import IG_AUTO_TOKEN_RTOL, integrated_gradients_map
from lightning_xai.attribution.quadrature import IG_RULES, ig_nodes
from lightning_xai.attribution.smooth_grad import smooth_grad_map
from lightning_xai.attribution.occlusion import LOO_MODES, occlusion_batch
from lightning_xai.attribution.interactions import integrated_hessians
from lightning_xai.attribution.lrp import LRP_ENCODER_RULES, lrp, register_lrp_encoder

__all__ = ["ATTRIBUTION_METHODS", "IG_AUTO_TOKEN_RTOL", "IG_RULES", "LOO_MODES", "LRP_ENCODER_RULES", "attribute",
           "auto_internal_batch_size", "check_method_options", "check_token_mask", "clone_inference_tensors", "explanation_context", "ig_nodes",
           "integrated_gradients_map", "integrated_hessians", "lrp",
           "occlusion_batch", "pad_embeddings", "predicted_class", "register_lrp_encoder", "register_method",
           "remove_tokens", "resolve_target", "shared_input_gradients", "smooth_grad_map", "gather_rows",
           "target_probabilities", "target_score"]

# methods that live in optional sibling modules (e.g. "lrp") register themselves on import
from lightning_xai.attribution.core import _load_plugins  # noqa: E402

_load_plugins()
del _load_plugins

"""Saliency maps for any :class:`~lightning_xai.adapters.ExplainableModel` through one verb, :func:`attribute`.

Methods: ``attention``, ``gradient``, ``grad_x_input``, ``integrated_gradients``, ``smooth_grad``,
``leave_one_out``, ``smooth_attention``, ``integrated_hessians`` (:func:`integrated_hessians` gives its ``[B, T, T]``
pairwise interactions), the context-mixing methods of :mod:`~lightning_xai.attribution.context_mixing`, any method
registered with :func:`register_method` (its :class:`MethodRecord` carries the facts callers need), or a Captum
attribution object.
:func:`explanation_context` makes explanations safe inside ``trainer.validate``/``test`` and training steps;
:func:`shared_input_gradients` lets gradient and grad×input of the same inputs share one backward pass.
"""

# the modules below register their methods when imported (imported here, where import-linter sees them)
from lightning_xai.attribution import context_mixing, smooth_attention  # noqa: F401
from lightning_xai.attribution.batching import gather_rows, pad_embeddings, remove_tokens
from lightning_xai.attribution.context import clone_inference_tensors, explanation_context
from lightning_xai.attribution.core import (
    attribute,
    check_method_options,
    check_token_mask,
    predicted_class,
    resolve_target,
    target_probabilities,
    target_score,
)
from lightning_xai.attribution.gradients import auto_internal_batch_size, shared_input_gradients
from lightning_xai.attribution.integrated_gradients import IG_AUTO_TOKEN_RTOL, integrated_gradients_map
from lightning_xai.attribution.interactions import integrated_hessians
from lightning_xai.attribution.lrp import LRP_ENCODER_RULES, lrp, register_lrp_encoder
from lightning_xai.attribution.occlusion import LOO_MODES, occlusion_batch
from lightning_xai.attribution.quadrature import IG_RULES, ig_nodes
from lightning_xai.attribution.registry import (
    ATTRIBUTION_METHODS,
    PAIRWISE_INTERACTIONS,
    RETURNS,
    SCORES,
    SCORES_AND_DELTA,
    MethodRecord,
    method_record,
    register_method,
)
from lightning_xai.attribution.smooth_grad import smooth_grad_map

__all__ = [
    "ATTRIBUTION_METHODS",
    "IG_AUTO_TOKEN_RTOL",
    "IG_RULES",
    "LOO_MODES",
    "LRP_ENCODER_RULES",
    "MethodRecord",
    "PAIRWISE_INTERACTIONS",
    "RETURNS",
    "SCORES",
    "SCORES_AND_DELTA",
    "attribute",
    "auto_internal_batch_size",
    "check_method_options",
    "check_token_mask",
    "clone_inference_tensors",
    "explanation_context",
    "gather_rows",
    "ig_nodes",
    "integrated_gradients_map",
    "integrated_hessians",
    "lrp",
    "method_record",
    "occlusion_batch",
    "pad_embeddings",
    "predicted_class",
    "register_lrp_encoder",
    "register_method",
    "remove_tokens",
    "resolve_target",
    "shared_input_gradients",
    "smooth_grad_map",
    "target_probabilities",
    "target_score",
]

"""The one protocol every capability of lightning_xai works through.

A model is *explainable* when it can (1) turn a batch into input embeddings that stay connected to the
autograd graph, (2) run the rest of the network from those embeddings, optionally with the attention
distribution replaced, and (3) say which positions are real tokens. Attribution, audits, metrics,
callbacks and losses only ever talk to a model through this protocol.

A model that explains *generation* (a causal LM or an encoder–decoder producing a target sequence) speaks the
same protocol: its token mask covers the source (prompt) tokens, ``attention`` is the target's attention over them,
and its output carries the log-probabilities of the target tokens (``target_log_probs``), which is what the
attribution methods explain for it (:mod:`lightning_xai.attribution.targets`); it says so with the
:class:`~lightning_xai.adapters.capabilities.TargetSequence` capability.

Optional capabilities (a fast path for leave-one-out's deletions, an embedding shift for the input-invariance
check, a linear head, an encoder with an LRP rule) are small ``runtime_checkable`` protocols of their own in
:mod:`lightning_xai.adapters.capabilities`; the generic layers ask for those, never for a model class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol, Tuple, runtime_checkable

from torch import Tensor

Batch = Mapping[str, Any]

__all__ = ["Batch", "ExplainOutput", "ExplainableModel", "ProtocolError", "as_explainable", "check_embeddings"]


class ProtocolError(TypeError):
    """Raised when a model cannot be seen through the :class:`ExplainableModel` protocol."""


@dataclass
class ExplainOutput:
    """What an explainable forward pass returns.

    Attributes:
        logits: ``[B, C]`` unnormalised class scores. For a model that explains generation
            (:class:`~lightning_xai.adapters.capabilities.TargetSequence`): the model's own next-token scores
            ``[B, S, V]`` (not what is explained; see ``target_log_probs``).
        attention: ``[B, T]`` the token distribution the model attends with: sums to 1 over real tokens,
            0 on pads and special tokens. For transformers a chosen reduction of the raw maps.
        hidden_states: ``[B, T, H]`` the encoder outputs the attention pools (``None`` if not available).
        attention_scores: ``[B, T]`` pre-softmax scores (``-inf`` on masked positions) when the model has them.
        raw_attentions: per-layer ``[B, heads, T, T]`` maps for multi-head models.
        extras: anything else an adapter wants to expose (e.g. the pooled context vector).
        target_log_probs: generation only, ``[B, K]``: ``log p(y_k | y_<k, source)`` of the ``k``-th target token of
            each row (its target tokens in order: the positions where ``labels != -100``), 0 where ``target_steps``
            is False. ``None`` for classifiers. What gradient methods differentiate for a generation model.
        target_steps: generation only, ``[B, K]`` bool: True where row ``b`` has a ``k``-th target token.
    """

    logits: Tensor
    attention: Tensor
    hidden_states: Optional[Tensor] = None
    attention_scores: Optional[Tensor] = None
    raw_attentions: Optional[Tuple[Tensor, ...]] = None
    extras: dict = field(default_factory=dict)
    target_log_probs: Optional[Tensor] = None
    target_steps: Optional[Tensor] = None


@runtime_checkable
class ExplainableModel(Protocol):
    """A model seen the way lightning_xai needs to see it.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> isinstance(AttentionClassifier(vocab_size=10, num_classes=2), ExplainableModel)
        True
    """

    def embed(self, batch: Batch) -> Tensor:
        """``[B, T, E]`` input embeddings, graph-connected to the model's embedding parameters."""
        ...

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        """Run the model from ``embeddings``; ``attention_override`` ``[B, T]`` replaces its attention."""
        ...

    def token_mask(self, batch: Batch) -> Tensor:
        """``[B, T]`` bool: True at real tokens (not pad, not special)."""
        ...


_REQUIRED = ("embed", "forward_from_embeddings", "token_mask")


def check_embeddings(embeddings: Tensor, mask: Tensor) -> None:
    """Raise a ValueError unless ``embeddings`` is ``[B, T, E]`` for the batch's ``[B, T]`` token ``mask``.

    Example:
        >>> import torch
        >>> check_embeddings(torch.zeros(2, 3, 4), torch.ones(2, 3, dtype=torch.bool))
        >>> check_embeddings(torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))
        Traceback (most recent call last):
        ...
        ValueError: embeddings have shape (2, 4) but the token mask is (2, 3); expected [B, T, E] with the batch's [B, T].
    """
    if embeddings.dim() != 3 or embeddings.shape[:2] != mask.shape:
        raise ValueError(
            f"embeddings have shape {tuple(embeddings.shape)} but the token mask is "
            f"{tuple(mask.shape)}; expected [B, T, E] with the batch's [B, T]."
        )


def as_explainable(model: Any) -> ExplainableModel:
    """Return ``model`` if it implements :class:`ExplainableModel`, else raise a clear error.

    Args:
        model: a reference model, an adapter, or anything with the three protocol methods.

    Raises:
        ProtocolError: naming the missing methods and the adapters that add them.

    Example:
        >>> import torch
        >>> as_explainable(torch.nn.Linear(2, 2))
        Traceback (most recent call last):
        ...
        lightning_xai.adapters.protocol.ProtocolError: Linear does not implement the ExplainableModel protocol (missing: embed, forward_from_embeddings, token_mask). Wrap it: HuggingFaceAdapter for transformers classifiers, HookAdapter for any nn.Module whose embedding and attention layers you can name.
    """
    missing = [name for name in _REQUIRED if not callable(getattr(model, name, None))]
    if missing:
        raise ProtocolError(
            f"{type(model).__name__} does not implement the ExplainableModel protocol "
            f"(missing: {', '.join(missing)}). Wrap it: HuggingFaceAdapter for transformers classifiers, "
            "HookAdapter for any nn.Module whose embedding and attention layers you can name."
        )
    return model

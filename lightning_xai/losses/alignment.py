"""Align attention with a saliency map: KL between the attention distribution and normalised saliency."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.losses._common import FiniteGuard, check_weight, require_finite, require_model, token_mask
from lightning_xai.metrics.functional.divergence import kl_divergence

__all__ = ["AttentionAlignmentLoss", "attention_alignment_kl", "normalize_saliency"]

SaliencyFn = Callable[..., Tensor]
_DIRECTIONS = ("saliency_to_attention", "attention_to_saliency")


def normalize_saliency(saliency: Tensor, mask: Tensor, eps: float = 1e-12) -> Tensor:
    """|saliency| on real tokens divided by its row sum; rows with no saliency become uniform over real tokens.

    Example:
        >>> normalize_saliency(torch.tensor([[-1.0, 3.0, 5.0]]), torch.tensor([[True, True, False]]))
        tensor([[0.2500, 0.7500, 0.0000]])
    """
    fmask = mask.to(saliency.dtype)
    scores = saliency.abs() * fmask
    total = scores.sum(-1, keepdim=True)
    uniform = fmask / fmask.sum(-1, keepdim=True).clamp_min(1.0)
    return torch.where(total > eps, scores / total.clamp_min(eps), uniform)


def attention_alignment_kl(
    attention: Tensor, saliency: Tensor, mask: Tensor, direction: str = "saliency_to_attention"
) -> Tensor:
    """Mean over the batch of KL(s ‖ α) (``saliency_to_attention``) or KL(α ‖ s), s the normalised saliency.

    Raises:
        ValueError: an unknown direction, or NaN or infinite attention or saliency.

    Example:
        >>> a = torch.tensor([[0.5, 0.5]])
        >>> attention_alignment_kl(a, torch.tensor([[1.0, 1.0]]), torch.tensor([[True, True]]))
        tensor(0.)
    """
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}.")
    require_finite("attention_alignment_kl", attention=attention, saliency=saliency)
    return _alignment_kl(attention, saliency, mask, direction)


def _alignment_kl(attention: Tensor, saliency: Tensor, mask: Tensor, direction: str) -> Tensor:
    target = normalize_saliency(saliency, mask)
    if direction == "saliency_to_attention":
        return kl_divergence(target, attention, check=False).mean()
    return kl_divergence(attention, target, check=False).mean()


class AttentionAlignmentLoss(FiniteGuard, nn.Module):
    """weight · KL between the model's attention and a saliency map of the same model (a faithfulness prior).

    The saliency map is ``lightning_xai.attribution.attribute(model, batch, method, target, create_graph=...)``
    (or your own callable ``saliency(model, batch, create_graph=...) -> [B, T]``), normalised as
    |s| / Σ|s| over real tokens.

    Where gradients flow: with ``create_graph=False`` (default) the saliency map is computed, then detached —
    a fixed target, so gradients reach only the attention distribution (scorer, encoder, embeddings through
    α). With ``create_graph=True`` the map stays in the graph (double backpropagation): gradients also flow
    through the saliency into every parameter it depends on, so the model is also pushed to make its own
    saliency match its attention. That is about 2–3× the cost of a training step.

    ``direction="saliency_to_attention"`` (default) is KL(s ‖ α): attention must cover what saliency marks;
    ``"attention_to_saliency"`` is KL(α ‖ s): attention must not sit where saliency is 0.

    Args:
        method: an attribution method name (``"gradient"``, ``"grad_x_input"``, ``"integrated_gradients"``,
            ...) or a callable.
        weight: loss weight.
        create_graph: differentiate through the saliency map.
        direction: which KL.
        target: class to explain (``None`` = predicted class).
        name: the logged name.
        **options: passed to ``attribute``.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> def saliency(model, batch, create_graph=False):
        ...     return torch.tensor([[1.0, 0.0, 0.0]])
        >>> loss = AttentionAlignmentLoss(saliency)(model(batch), batch, model=model)
        >>> bool(loss > 0)
        True
    """

    def __init__(
        self,
        method: Union[str, SaliencyFn] = "gradient",
        weight: float = 1.0,
        create_graph: bool = False,
        direction: str = "saliency_to_attention",
        target: Optional[int] = None,
        name: str = "alignment",
        **options: Any,
    ) -> None:
        super().__init__()
        if direction not in _DIRECTIONS:
            raise ValueError(f"direction must be one of {_DIRECTIONS}, got {direction!r}.")
        weight = check_weight(weight, "AttentionAlignmentLoss")
        if not (isinstance(method, str) or callable(method)):
            raise TypeError(f"method must be an attribution method name or a callable, got {type(method).__name__}.")
        self.method = method
        self.weight = float(weight)
        self.create_graph = bool(create_graph)
        self.direction = direction
        self.target = target
        self.name = name
        self.options = options

    def saliency(self, model: Any, batch: Batch) -> Tensor:
        """The raw ``[B, T]`` saliency map (in the graph only when ``create_graph``)."""
        if callable(self.method):
            scores = self.method(model, batch, create_graph=self.create_graph)
        else:
            from lightning_xai.attribution import attribute

            scores = attribute(
                model, batch, self.method, target=self.target, create_graph=self.create_graph, **self.options
            )
        return scores if self.create_graph else scores.detach()

    def forward(self, outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
        explained = require_model(model, "AttentionAlignmentLoss")  # model: the holder, which logs
        mask = token_mask(outputs, batch, explained)
        scores = self.saliency(explained, batch).to(outputs.attention.dtype)
        if scores.shape != outputs.attention.shape:
            raise ValueError(
                f"saliency has shape {tuple(scores.shape)} but attention has {tuple(outputs.attention.shape)}."
            )
        value = self.weight * _alignment_kl(outputs.attention, scores, mask, self.direction)
        return self.finite_or_zero(value, model, attention=outputs.attention, saliency=scores)

    def extra_repr(self) -> str:
        method = self.method if isinstance(self.method, str) else getattr(self.method, "__name__", "callable")
        return (
            f"method={method!r}, weight={self.weight}, create_graph={self.create_graph}, direction={self.direction!r}"
        )

"""Helpers shared by the loss modules (private)."""

from __future__ import annotations

import math
import warnings
from typing import Any, List, Optional

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput, ProtocolError
from lightning_xai.adapters.resolve import explainable_model


def log_extra(model: Any, key: str, value: Any, batch_size: Optional[int] = None) -> None:
    """Log ``value`` through ``model.log`` when ``model`` is a LightningModule inside a Trainer hook; else no-op."""
    if model is None or getattr(model, "_trainer", None) is None:
        return
    if getattr(model, "_current_fx_name", None) is None or getattr(model.trainer, "barebones", False):
        return
    if isinstance(value, Tensor):
        value = value.detach()
    model.log(key, value, batch_size=batch_size)


def token_mask(outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
    """The ``[B, T]`` real-token mask: from the model (or the one it holds) if given, else ``batch['mask']``, else
    attention > 0."""
    if model is not None and not callable(getattr(model, "token_mask", None)):
        try:
            model = require_model(model, "token_mask")
        except ProtocolError:
            model = None
    if model is not None and callable(getattr(model, "token_mask", None)):
        return model.token_mask(batch).bool()
    if "mask" in batch:
        return batch["mask"].bool()
    return outputs.attention > 0


def require_model(model: Any, loss_name: str) -> ExplainableModel:
    """The explainable model of ``model``: itself, or what it holds (:func:`~lightning_xai.adapters.resolve.
    explainable_model`: e.g. the one ``transformers`` sequence classifier of a user's LightningModule).

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=10, num_classes=2)
        >>> require_model(model, "MyLoss") is model
        True
        >>> try:
        ...     require_model(None, "MyLoss")
        ... except ValueError as error:
        ...     print(str(error).split(":")[0])
        MyLoss needs the model
    """
    if model is None:
        raise ValueError(
            f"{loss_name} needs the model: call it as loss(outputs, batch, model=self) "
            "(AttentionClassifier passes model=self to its objectives)."
        )
    return explainable_model(model, owner=loss_name)


def batch_size_of(outputs: ExplainOutput) -> int:
    return int(outputs.logits.shape[0])


def as_float(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(device=like.device, dtype=like.dtype)


def bool_batch_mask(batch: Batch, key: str, owner: str, hint: str) -> Tensor:
    """``batch[key]``, checked to be a bool tensor; ``hint`` says what the key holds and where it comes from."""
    if key not in batch:
        raise KeyError(f"{owner} needs batch[{key!r}] (bool [B, T], {hint}).")
    value = batch[key]
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        raise TypeError(
            f"batch[{key!r}] must be a bool tensor, got {getattr(value, 'dtype', type(value))}; use .bool()."
        )
    return value


def ensure_scalar(value: Tensor) -> Tensor:
    return value.reshape(()) if value.numel() == 1 else value.mean()


def check_weight(value: Any, owner: str, name: str = "weight") -> float:
    """``value`` as a float, checked to be a finite loss strength ``>= 0`` (the one check of every loss's weights).

    Example:
        >>> check_weight(0.5, "DeceptionPenalty")
        0.5
        >>> check_weight(float("nan"), "DeceptionPenalty")
        Traceback (most recent call last):
        ...
        ValueError: DeceptionPenalty: weight must be >= 0 and finite, got nan.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}: {name} must be >= 0 and finite, got {value!r}.")
    return float(value)


def nonfinite(**tensors: Optional[Tensor]) -> List[str]:
    """The names of the ``tensors`` holding a NaN or an infinity (``None`` entries skipped); one device sync.

    Example:
        >>> nonfinite(attention=torch.tensor([0.5, float("nan")]), logits=torch.zeros(2))
        ['attention']
    """
    named = [(k, t) for k, t in tensors.items() if isinstance(t, Tensor) and t.numel()]
    if not named:
        return []
    device = named[0][1].device
    flags = torch.stack([torch.isfinite(t.detach()).all().to(device) for _, t in named]).tolist()
    return [k for (k, _), ok in zip(named, flags) if not ok]


def require_finite(owner: str, **tensors: Optional[Tensor]) -> None:
    """Raise a ``ValueError`` naming ``owner`` and each of ``tensors`` that holds a NaN or an infinity.

    Example:
        >>> require_finite("conicity", hidden=torch.tensor([float("inf")]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: conicity: hidden holds NaN or infinite values; ...
    """
    bad = nonfinite(**tensors)
    if bad:
        raise ValueError(
            f"{owner}: {' and '.join(bad)} hold{'s' if len(bad) == 1 else ''} NaN or infinite values; "
            "the loss would be NaN (and so would every weight it reaches). Check the model's outputs "
            "(a diverged step? an all-padding row?)."
        )


def zero_loss(model: Any, like: Tensor) -> Tensor:
    """A scalar 0 that stays in the graph through ``model``'s trainable parameters only (their gradient is an exact 0,
    whatever NaN the batch's outputs hold), or a zero leaf that requires grad when there is no model.

    Example:
        >>> layer = nn.Linear(2, 1)
        >>> zero_loss(layer, torch.zeros(())).backward()
        >>> layer.weight.grad
        tensor([[0., 0.]])
    """
    params = [p for p in model.parameters() if p.requires_grad] if isinstance(model, nn.Module) else []
    if params:
        return torch.stack([p.sum() for p in params]).sum().to(like.dtype) * 0.0
    return torch.zeros((), dtype=like.dtype, device=like.device, requires_grad=True)


class FiniteGuard:
    """Mixin of the loss modules: a batch whose inputs or loss are not finite gives a zero loss, with a warning.

    The module form of a loss must not turn one bad batch into NaN weights: :meth:`finite_or_zero` checks the value
    and the named inputs (one device sync), and on a NaN or an infinity warns once per loss (naming the loss and
    the tensors), counts the batch in :attr:`nonfinite_batches` and returns :func:`zero_loss` — a 0 whose gradient
    reaches only the model's parameters, as exact zeros. The functional forms raise a ``ValueError`` instead.

    Example:
        >>> import warnings
        >>> class Total(FiniteGuard, nn.Module):
        ...     def forward(self, attention):
        ...         return self.finite_or_zero(attention.sum(), attention=attention)
        >>> with warnings.catch_warnings(record=True):
        ...     warnings.simplefilter("always")
        ...     value = Total()(torch.tensor([0.5, float("nan")]))
        >>> value
        tensor(0., requires_grad=True)
    """

    nonfinite_batches: int = 0
    _nonfinite_warned: bool = False

    def finite_or_zero(self, value: Tensor, model: Any = None, **inputs: Optional[Tensor]) -> Tensor:
        bad = nonfinite(**inputs, loss=value)
        if not bad:
            return value
        self.nonfinite_batches += 1
        if not self._nonfinite_warned:
            self._nonfinite_warned = True
            warnings.warn(
                f"{type(self).__name__}: {' and '.join(bad)} hold NaN or infinite values on this batch; "
                "the loss is set to 0 for it (gradient 0, so the weights stay finite) instead of NaN. "
                "Batches skipped so far are counted in .nonfinite_batches; check the model's outputs "
                "(a diverged step? an all-padding row?).",
                RuntimeWarning,
                stacklevel=3,
            )
        return zero_loss(model, value)


__all__ = [
    "FiniteGuard",
    "as_float",
    "batch_size_of",
    "bool_batch_mask",
    "check_weight",
    "ensure_scalar",
    "log_extra",
    "nonfinite",
    "require_finite",
    "require_model",
    "token_mask",
    "zero_loss",
]

"""Helpers shared by the loss modules (private)."""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainOutput


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
    """The ``[B, T]`` real-token mask: from the model if given, else ``batch['mask']``, else attention > 0."""
    if model is not None and callable(getattr(model, "token_mask", None)):
        return model.token_mask(batch).bool()
    if "mask" in batch:
        return batch["mask"].bool()
    return outputs.attention > 0


def require_model(model: Any, loss_name: str) -> Any:
    if model is None:
        raise ValueError(f"{loss_name} needs the model: call it as loss(outputs, batch, model=self) "
                         "(AttentionClassifier passes model=self to its objectives).")
    return model


def batch_size_of(outputs: ExplainOutput) -> int:
    return int(outputs.logits.shape[0])


def as_float(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(device=like.device, dtype=like.dtype)


def renamed_lam(weight: float, lam: Optional[float], owner: str, default: float = 1.0) -> float:
    """The loss strength ``weight``, or the value of its deprecated name ``lam`` (with a ``DeprecationWarning``).

    Every loss calls its strength ``weight``; ``DeceptionPenalty`` and ``ModelConsistentAdversary`` (and their
    functions) called it ``lam`` until issue 13, and still accept it.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     value = renamed_lam(1.0, 0.1, "DeceptionPenalty")
        >>> value, caught[0].category.__name__
        (0.1, 'DeprecationWarning')
    """
    if lam is None:
        return float(weight)
    if weight != default:
        raise TypeError(f"{owner} got weight={weight} and lam={lam}; lam is the deprecated name of weight, pass "
                        "weight only.")
    warnings.warn(f"{owner}: lam= is deprecated, use weight= (the name of the strength in every loss).",
                  DeprecationWarning, stacklevel=3)
    return float(lam)


class DeprecatedLam:
    """Mixin: ``loss.lam`` reads and sets ``loss.weight``, with a ``DeprecationWarning`` (the old attribute name)."""

    weight: float

    @property
    def lam(self) -> float:
        """Deprecated name of ``weight``."""
        warnings.warn(f"{type(self).__name__}.lam is deprecated; use .weight.", DeprecationWarning, stacklevel=2)
        return self.weight

    @lam.setter
    def lam(self, value: float) -> None:
        warnings.warn(f"{type(self).__name__}.lam is deprecated; use .weight.", DeprecationWarning, stacklevel=2)
        self.weight = float(value)


def bool_batch_mask(batch: Batch, key: str, owner: str, hint: str) -> Tensor:
    """``batch[key]``, checked to be a bool tensor; ``hint`` says what the key holds and where it comes from."""
    if key not in batch:
        raise KeyError(f"{owner} needs batch[{key!r}] (bool [B, T], {hint}).")
    value = batch[key]
    if not isinstance(value, Tensor) or value.dtype != torch.bool:
        raise TypeError(f"batch[{key!r}] must be a bool tensor, got {getattr(value, 'dtype', type(value))}; "
                        "use .bool().")
    return value


def ensure_scalar(value: Tensor) -> Tensor:
    return value.reshape(()) if value.numel() == 1 else value.mean()


__all__ = ["DeprecatedLam", "as_float", "batch_size_of", "bool_batch_mask", "ensure_scalar", "log_extra",
           "renamed_lam", "require_model", "token_mask"]

"""Which class an explanation is for, and the score that is explained: target resolution and checks.

The lowest module of :mod:`lightning_xai.attribution`: :mod:`~lightning_xai.attribution.core` (the method
registry and :func:`~lightning_xai.attribution.attribute`) and
:mod:`~lightning_xai.attribution.captum_bridge` both build on it, so neither needs the other's internals.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel, as_explainable
from lightning_xai.attribution.context import explanation_context

__all__ = ["OUTPUTS", "check_real_tokens", "check_token_mask", "predicted_class", "resolve_target",
           "target_probabilities", "target_score", "warn_nonfinite_logits"]

#: the scores a gradient method can differentiate: ``output=`` of :func:`~lightning_xai.attribution.attribute`
OUTPUTS = ("probability", "logit", "log_probability")


def check_real_tokens(mask: Any, source: str = "token_mask(batch)") -> Tensor:
    """``mask`` after checking that it is a bool ``[B, T]`` tensor with a real token in every row.

    Args:
        mask: the ``[B, T]`` real-token mask.
        source: how the error messages name it (e.g. ``"batch['mask']"``).

    Example:
        >>> check_real_tokens(torch.tensor([[True, False], [False, False]]))
        Traceback (most recent call last):
        ...
        ValueError: Batch rows [1] have no real token (all pad/special), so there is nothing to explain or classify; drop empty examples before batching.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise ValueError(f"{source} must be a [B, T] tensor; got {getattr(mask, 'shape', type(mask))}.")
    if mask.dtype != torch.bool:
        raise TypeError(f"{source} must be a bool tensor, got {mask.dtype}; use .bool().")
    empty = (~mask.any(dim=1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(f"Batch rows {empty.tolist()[:10]} have no real token (all pad/special), so there is "
                         "nothing to explain or classify; drop empty examples before batching.")
    return mask


def check_token_mask(model: ExplainableModel, batch: Batch) -> Tensor:
    """``model.token_mask(batch)`` after checking it is a bool ``[B, T]`` with a real token in every row."""
    return check_real_tokens(model.token_mask(batch), f"{type(model).__name__}.token_mask(batch)")


def warn_nonfinite_logits(logits: Tensor) -> bool:
    """Warn (RuntimeWarning) when ``logits`` hold NaN or inf; return whether they are all finite.

    Every explanation of such a row is NaN or meaningless (its predicted class is the argmax of NaN): the maps are
    returned as computed (NaN propagates, so metrics count those rows as undefined), never as a finite wrong map.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_nonfinite_logits(torch.tensor([[0.0, float("nan")], [1.0, 2.0]]))
        False
        >>> str(caught[0].message).split(":")[0]
        "the model's logits are not finite (NaN or inf in rows [0])"
    """
    if not logits.is_floating_point():
        return True
    finite = torch.isfinite(logits.detach()).all(dim=-1)
    if bool(finite.all()):
        return True
    rows = (~finite).nonzero().flatten().tolist()
    warnings.warn(f"the model's logits are not finite (NaN or inf in rows {rows[:10]}{' ...' if len(rows) > 10 else ''}"
                  "): every explanation of those rows is NaN or meaningless. Check the model's weights (a diverged "
                  "training run), the inputs, and overflow under float16 (use bf16 or float32).",
                  RuntimeWarning, stacklevel=3)
    return False


def resolve_target(logits: Tensor, target: Any = None) -> Tensor:
    """The class each row is explained for, as a validated ``LongTensor[B]``.

    Args:
        logits: ``[B, C]`` model outputs on the unperturbed input.
        target: ``None`` (the predicted class), an int (same class for every row), or an integer tensor /
            sequence of ``B`` class indices.

    Raises:
        ValueError: wrong length or a class outside ``[0, C)``.
        TypeError: a float or bool target.

    Example:
        >>> resolve_target(torch.tensor([[0.1, 2.0], [3.0, 0.0]]))
        tensor([1, 0])
        >>> resolve_target(torch.zeros(2, 2), 5)
        Traceback (most recent call last):
        ...
        ValueError: target 5 is out of range for a model with 2 classes: valid targets are 0..1.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, C]; got shape {tuple(logits.shape)}.")
    warn_nonfinite_logits(logits)
    B, C = logits.shape
    if target is None:
        return logits.detach().argmax(dim=-1)
    if isinstance(target, bool) or (isinstance(target, Tensor) and target.dtype == torch.bool):
        raise TypeError("target must be a class index (int or LongTensor[B]), not a bool.")
    if isinstance(target, int) or (hasattr(target, "__index__") and not isinstance(target, Tensor)
                                   and not isinstance(target, (list, tuple))):
        value = int(target)
        if not 0 <= value < C:
            raise ValueError(f"target {value} is out of range for a model with {C} classes: valid targets are "
                             f"0..{C - 1}.")
        return torch.full((B,), value, dtype=torch.long, device=logits.device)
    if isinstance(target, (list, tuple)):
        target = torch.as_tensor(target)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be None, an int or a LongTensor[B]; got {type(target).__name__}.")
    if target.is_floating_point() or target.is_complex():
        raise TypeError(f"target must hold class indices (an integer tensor); got {target.dtype}. "
                        "Use target.long() if the values are whole numbers.")
    if target.dim() == 0:
        return resolve_target(logits, int(target))
    if tuple(target.shape) != (B,):
        raise ValueError(f"target has shape {tuple(target.shape)}; expected ({B},), one class per row of the "
                         "batch (or an int for all rows).")
    target = target.to(device=logits.device, dtype=torch.long)
    bad = (target < 0) | (target >= C)
    if bool(bad.any()):
        raise ValueError(f"target values {sorted(set(target[bad].tolist()))[:10]} are out of range for a model "
                         f"with {C} classes: valid targets are 0..{C - 1}.")
    return target


def target_score(logits: Tensor, target: Tensor, output: str = "probability") -> Tensor:
    """``[B]`` score of the target class: its probability, logit, or log-probability."""
    if output == "probability":
        values = logits.softmax(dim=-1)
    elif output == "logit":
        values = logits
    elif output == "log_probability":
        values = logits.log_softmax(dim=-1)
    else:
        raise ValueError(f"Unknown output {output!r}; choose one of {list(OUTPUTS)}.")
    return values.gather(1, target.view(-1, 1)).squeeze(1)


def predicted_class(model: Any, batch: Batch) -> Tensor:
    """``LongTensor[B]``: the class the model predicts for each row (eval mode, no gradients).

    Works under ``torch.inference_mode`` and restores the model's modes.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, num_classes=3, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> predicted_class(model, batch).shape
        torch.Size([2])
    """
    model = as_explainable(model)
    with explanation_context(model, batch) as batch, torch.no_grad():
        return model.forward_from_embeddings(model.embed(batch), batch).logits.argmax(dim=-1)


def target_probabilities(model: Any, batch: Batch, target: Any = None, *,
                         embeddings: Optional[Tensor] = None, output: str = "probability") -> Tensor:
    """``[B]`` probability of ``target`` (default: the predicted class) for each row.

    Runs the model as it is (its current train/eval mode) under the caller's grad mode, so the value is
    differentiable when gradients are enabled (useful in losses); call ``model.eval()`` for deterministic
    values. ``embeddings`` (``[B, T, E]``) replaces ``model.embed(batch)``, e.g. to score perturbed inputs.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> p = target_probabilities(model, batch, target=0) + target_probabilities(model, batch, target=1)
        >>> torch.allclose(p, torch.ones(1))
        True
    """
    model = as_explainable(model)
    emb = model.embed(batch) if embeddings is None else embeddings
    logits = model.forward_from_embeddings(emb, batch).logits
    return target_score(logits, resolve_target(logits, target), output)

"""Which class an explanation is for, and the score that is explained: target resolution and checks.

**Classifiers.** The target is a class (``None``: the predicted one); the explained score is its probability
(``output="probability"``, the default), its logit, or its log-probability.

**Heads.** A classifier's ``[B, C]`` logits are read through its
:class:`~lightning_xai.adapters.capabilities.HeadKind` (:func:`~lightning_xai.adapters.capabilities.head_kind_of`;
a model that does not say is a softmax classifier), by :func:`score_values` and nowhere else:

=============  ========================  ========================  =================  =====================
head           ``output="probability"``  ``"log_probability"``     ``"logit"``        ``output=None``
=============  ========================  ========================  =================  =====================
``softmax``    softmax over the C        log-softmax               the class's logit  probability
``sigmoid``    sigmoid of the label      log-sigmoid of the label  the label's logit  probability
``regression`` refused (no classes)      refused                   the output value   the output value
=============  ========================  ========================  =================  =====================

A regression head has no probability: asking for one explicitly raises a ValueError naming ``output="logit"`` (the
value) rather than explaining a softmax of one number, which is the constant 1 and gave all-zero maps; the default
(``output=None``) explains the value. :func:`~lightning_xai.attribution.heads.default_output` names that default per model and
:func:`~lightning_xai.attribution.heads.explained_quantity` says in words what a map explains (for logs and reports). The target of a multi-label model
is a label index; ``None`` is its highest-scoring label, and :func:`~lightning_xai.attribution.heads.label_targets` lists every predicted label of every
row (each ``(row, label)`` pair then explained on its own). :func:`decisions` is what a decision flip watches: the
argmax class, a multi-label model's set of labels above 0.5; a regression head makes none.

**Generation.** For a model whose output carries ``target_log_probs`` (the
:class:`~lightning_xai.adapters.capabilities.TargetSequence` capability) the target is a *step* of the batch's
target sequence, and the explained score is a **log-probability**, never a softmax over classes:

* ``target=None`` (represented as :data:`WHOLE_TARGET`, -1): ``Σ_k log p(y_k | y_<k, source)``, the log-probability
  of the whole target (force decoding of ``labels``; for free decoding build ``labels`` from the model's greedy
  output first);
* ``target=k`` (an int, or a ``LongTensor[B]`` of steps, -1 for the whole target): the ``k``-th target token's
  ``log p(y_k | y_<k, source)``; every row must have a ``k``-th target token;
* ``target="steps"`` (:func:`~lightning_xai.attribution.attribute` only): one map per step, ``[B, K, T]``.

``output=None`` (every method's default) means ``"probability"`` for a classifier and ``"log_probability"`` for
generation; ``"probability"`` given explicitly for generation is ``exp`` of that log-probability (the probability of
the target sequence or token), and ``"logit"`` is refused (a sequence has no logit).

The lowest module of :mod:`lightning_xai.attribution`: :mod:`~lightning_xai.attribution.core` (the method
registry and :func:`~lightning_xai.attribution.attribute`) and
:mod:`~lightning_xai.attribution.captum_bridge` both build on it, so neither needs the other's internals.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import HEAD_KINDS, head_kind_of
from lightning_xai.adapters.protocol import Batch, ExplainableModel, as_explainable
from lightning_xai.attribution.context import explanation_context

__all__ = [
    "OUTPUTS",
    "WHOLE_TARGET",
    "check_real_tokens",
    "check_token_mask",
    "explained_attention",
    "explained_values",
    "predicted_class",
    "resolve_target",
    "score_values",
    "target_probabilities",
    "target_score",
    "warn_nonfinite_logits",
]

#: the scores a gradient method can differentiate: ``output=`` of :func:`~lightning_xai.attribution.attribute`
OUTPUTS = ("probability", "logit", "log_probability")
#: a generation target's step meaning "the whole target sequence" (the sum of its steps' log-probabilities)
WHOLE_TARGET = -1


def _generation(scores: Any) -> Optional[Tensor]:
    """The ``[B, K]`` target log-probabilities of a generation output (``None`` for logits or a classifier's)."""
    return None if isinstance(scores, Tensor) else getattr(scores, "target_log_probs", None)


def _logits(scores: Any) -> Tensor:
    return scores if isinstance(scores, Tensor) else scores.logits


def explained_values(scores: Any) -> Tensor:
    """What an explanation's scores are read from: a classifier's ``[B, C]`` logits, a generator's ``[B, K]`` target
    log-probabilities (which do not depend on how wide the batch is padded).

    Example:
        >>> explained_values(torch.zeros(2, 3)).shape
        torch.Size([2, 3])
    """
    values = _generation(scores)
    return _logits(scores) if values is None else values


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
        raise ValueError(
            f"Batch rows {empty.tolist()[:10]} have no real token (all pad/special), so there is "
            "nothing to explain or classify; drop empty examples before batching."
        )
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
    warnings.warn(
        f"the model's logits are not finite (NaN or inf in rows {rows[:10]}{' ...' if len(rows) > 10 else ''}"
        "): every explanation of those rows is NaN or meaningless. Check the model's weights (a diverged "
        "training run), the inputs, and overflow under float16 (use bf16 or float32).",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


def resolve_target(logits: Any, target: Any = None) -> Tensor:
    """The class (or, for generation, the target step) each row is explained for, as a validated ``LongTensor[B]``.

    Args:
        logits: ``[B, C]`` model outputs on the unperturbed input, or the model's whole ``ExplainOutput`` (a
            generation model's carries ``target_log_probs``; see the module docstring).
        target: ``None`` (the predicted class; for generation the whole target, :data:`WHOLE_TARGET`), an int
            (same class / step for every row), or an integer tensor / sequence of ``B`` class indices (steps).

    Raises:
        ValueError: wrong length, a class outside ``[0, C)``, a step some row does not have.
        TypeError: a float or bool target.

    Example:
        >>> resolve_target(torch.tensor([[0.1, 2.0], [3.0, 0.0]]))
        tensor([1, 0])
        >>> resolve_target(torch.zeros(2, 2), 5)
        Traceback (most recent call last):
        ...
        ValueError: target 5 is out of range for a model with 2 classes: valid targets are 0..1.
    """
    if _generation(logits) is not None:
        return _resolve_step(logits, target)
    logits = _logits(logits)
    if logits.dim() != 2:
        hint = (
            (
                " This looks like a generation model's [B, S, V] next-token logits: explain it through "
                "HuggingFaceAdapter (its output carries target_log_probs), with a method that supports generation "
                "(attention, gradient, grad_x_input, integrated_gradients, smooth_grad, leave_one_out, "
                "smooth_attention or a Captum object)."
            )
            if logits.dim() == 3
            else ""
        )
        raise ValueError(f"logits must be [B, C]; got shape {tuple(logits.shape)}.{hint}")
    warn_nonfinite_logits(logits)
    B, C = logits.shape
    if target is None:
        return logits.detach().argmax(dim=-1)
    scalar = not isinstance(target, (Tensor, list, tuple)) or (isinstance(target, Tensor) and target.dim() == 0)
    target = _as_index_tensor(target, B, logits.device)
    bad = (target < 0) | (target >= C)
    if bool(bad.any()):
        values = sorted(set(target[bad].tolist()))
        if scalar:
            raise ValueError(
                f"target {values[0]} is out of range for a model with {C} classes: valid targets are 0..{C - 1}."
            )
        raise ValueError(
            f"target values {values[:10]} are out of range for a model with {C} classes: valid targets are 0..{C - 1}."
        )
    return target


def _as_index_tensor(target: Any, B: int, device: Any) -> Tensor:
    """``target`` (an int, a sequence or an integer tensor) as a ``LongTensor[B]`` (an int repeated)."""
    if isinstance(target, str):
        raise TypeError(f"target={target!r}: a string target is 'steps' (attribute() on a generation model) only.")
    if isinstance(target, bool) or (isinstance(target, Tensor) and target.dtype == torch.bool):
        raise TypeError("target must be a class index (int or LongTensor[B]), not a bool.")
    if isinstance(target, int) or (
        hasattr(target, "__index__") and not isinstance(target, Tensor) and not isinstance(target, (list, tuple))
    ):
        return torch.full((B,), int(target), dtype=torch.long, device=device)
    if isinstance(target, (list, tuple)):
        target = torch.as_tensor(target)
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be None, an int or a LongTensor[B]; got {type(target).__name__}.")
    if target.is_floating_point() or target.is_complex():
        raise TypeError(
            f"target must hold class indices (an integer tensor); got {target.dtype}. "
            "Use target.long() if the values are whole numbers."
        )
    if target.dim() == 0:
        return torch.full((B,), int(target), dtype=torch.long, device=device)
    if tuple(target.shape) != (B,):
        raise ValueError(
            f"target has shape {tuple(target.shape)}; expected ({B},), one class per row of the "
            "batch (or an int for all rows)."
        )
    return target.to(device=device, dtype=torch.long)


def _resolve_step(output: Any, target: Any) -> Tensor:
    """A generation target: ``LongTensor[B]`` of steps, :data:`WHOLE_TARGET` for the whole sequence."""
    log_probs, steps = output.target_log_probs, output.target_steps
    B = log_probs.shape[0]
    if steps is None:
        raise ValueError("a generation output with target_log_probs must also carry target_steps ([B, K] bool).")
    finite = torch.isfinite(log_probs.detach()).masked_fill(~steps, True).all(1)
    if not bool(finite.all()):
        warn_nonfinite_logits(torch.where(finite, 0.0, float("nan")).view(B, 1))
    if target is None:
        return torch.full((B,), WHOLE_TARGET, dtype=torch.long, device=log_probs.device)
    target = _as_index_tensor(target, B, log_probs.device)
    counts = steps.sum(1).to(target.device)
    bad = (target < WHOLE_TARGET) | (target >= counts)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()
        raise ValueError(
            f"target steps {sorted(set(target[bad].tolist()))[:10]} do not exist in rows {rows[:10]}, "
            f"which have {sorted(set(counts[bad].tolist()))[:10]} target tokens: a step k is the k-th "
            "explained token of a row (labels != -100), 0-based; -1 or None is the whole target. Use "
            "target='steps' for every step of every row."
        )
    return target


def score_values(logits: Tensor, output: str = "probability", head: str = "softmax") -> Tensor:
    """``[B, C]``: the scores of every class (label, output) that ``output`` names under a ``head`` (see the module
    docstring's table): the one function every explanation, erasure and faithfulness score goes through.

    Raises:
        ValueError: an unknown ``output`` or ``head``; a probability of a regression head (naming ``output="logit"``).

    Example:
        >>> logits = torch.tensor([[0.0, 0.0, 0.0]])
        >>> score_values(logits, "probability", "softmax"), score_values(logits, "probability", "sigmoid")
        (tensor([[0.3333, 0.3333, 0.3333]]), tensor([[0.5000, 0.5000, 0.5000]]))
        >>> score_values(torch.tensor([[2.5]]), "probability", "regression")
        Traceback (most recent call last):
        ...
        ValueError: output='probability' is not defined for a regression head (its outputs are values, not class scores: a softmax of one value is the constant 1, whose gradient is 0); explain the output value with output='logit'.
    """
    if output not in OUTPUTS:
        raise ValueError(f"Unknown output {output!r}; choose one of {list(OUTPUTS)}.")
    if head not in HEAD_KINDS:
        raise ValueError(f"Unknown head {head!r}; choose one of {list(HEAD_KINDS)}.")
    if output == "logit":
        return logits
    if head == "regression":
        raise ValueError(
            f"output={output!r} is not defined for a regression head (its outputs are values, not class "
            "scores: a softmax of one value is the constant 1, whose gradient is 0); explain the output "
            "value with output='logit'."
        )
    if head == "sigmoid":
        return logits.sigmoid() if output == "probability" else torch.nn.functional.logsigmoid(logits)
    return logits.softmax(dim=-1) if output == "probability" else logits.log_softmax(dim=-1)


def target_score(logits: Any, target: Tensor, output: Optional[str] = None, head: str = "softmax") -> Tensor:
    """``[B]`` explained score of ``target``: a class's probability, logit or log-probability under the model's
    ``head`` (:func:`score_values`); for generation (``logits`` an output carrying ``target_log_probs``) the target's
    or one step's log-probability (see the module docstring; ``output=None``: ``"probability"`` for classes, the
    value for a regression head, ``"log_probability"`` for generation)."""
    log_probs = _generation(logits)
    if log_probs is not None:
        return _step_score(logits, log_probs, target, output)
    if output is None:
        output = "logit" if head == "regression" else "probability"
    return score_values(_logits(logits), output, head).gather(1, target.view(-1, 1)).squeeze(1)


def _step_score(scores: Any, log_probs: Tensor, target: Tensor, output: Optional[str]) -> Tensor:
    if output == "logit":
        raise ValueError(
            "output='logit' has no meaning for a generated target (a sequence has no logit, and a "
            "token's logit is not comparable across steps); use output='log_probability' (the default "
            "for generation) or 'probability' (its exponential)."
        )
    if output not in (None, "log_probability", "probability"):
        raise ValueError(f"Unknown output {output!r}; choose one of {list(OUTPUTS)}.")
    steps = scores.target_steps.to(log_probs.device)
    target = target.to(log_probs.device)
    whole = (log_probs * steps.to(log_probs.dtype)).sum(1)
    K = log_probs.shape[1]
    index = target.clamp(0, max(K - 1, 0)).view(-1, 1)
    one = log_probs.gather(1, index).squeeze(1) if K else whole
    value = torch.where(target < 0, whole, one)
    return value.exp() if output == "probability" else value


def explained_attention(output: Any, target: Optional[Tensor] = None) -> Tensor:
    """``[B, T]``: the attention an explanation of ``target`` is compared with: ``output.attention``, except for a
    generation target step ``k``, whose own row is ``extras["step_attention"][:, k]``.

    Example:
        >>> from lightning_xai.adapters import ExplainOutput
        >>> explained_attention(ExplainOutput(logits=torch.zeros(1, 2), attention=torch.ones(1, 3) / 3)).shape
        torch.Size([1, 3])
    """
    if _generation(output) is None or target is None or not bool((target >= 0).any()):
        return output.attention
    per_step = (output.extras or {}).get("step_attention")
    if per_step is None:
        raise ValueError(
            "this generation output has no extras['step_attention'], so the attention of one target step "
            "is unknown; explain the whole target (target=None)."
        )
    index = target.clamp_min(0).to(per_step.device)
    rows = per_step[torch.arange(per_step.shape[0], device=per_step.device), index]
    return torch.where((target < 0).to(per_step.device)[:, None], output.attention, rows)


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


def target_probabilities(
    model: Any, batch: Batch, target: Any = None, *, embeddings: Optional[Tensor] = None, output: str = "probability"
) -> Tensor:
    """``[B]`` probability of ``target`` (default: the predicted class) for each row, under the model's head
    (:func:`score_values`; a regression model needs ``output="logit"``, its value).

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
    out = model.forward_from_embeddings(emb, batch)
    return target_score(out, resolve_target(out, target), output, head_kind_of(model))

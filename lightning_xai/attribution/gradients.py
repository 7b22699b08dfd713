"""Gradient-based token attributions: attention (for reference), gradient and grad×input; rows per pass.

All gradients are taken w.r.t. the model's input embeddings (``model.embed(batch)``) with
:func:`torch.autograd.grad`; parameters' ``.grad`` are never touched. Without ``create_graph`` the embeddings
are a detached leaf and the parameters are frozen (faster); with ``create_graph=True`` the embeddings stay
connected to the embedding table and every map is differentiable w.r.t. all parameters.

Integrated Gradients lives in :mod:`~lightning_xai.attribution.integrated_gradients` (its quadrature rules in
:mod:`~lightning_xai.attribution.quadrature`), SmoothGrad in :mod:`~lightning_xai.attribution.smooth_grad`.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Iterator, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.checks import check_attention_distribution
from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution.registry import register_method
from lightning_xai.attribution.targets import explained_attention, resolve_target, target_score

__all__ = ["auto_internal_batch_size", "shared_input_gradients", "attention_map", "gradient_map", "grad_x_input_map"]

REDUCTIONS = ("l2", "abs_sum")
#: elements of the ``[rows, T, E]`` embedding block handled per forward/backward pass by default
_CPU_BUDGET = 3 * 2**20
_GPU_BUDGET = 2**26


def auto_internal_batch_size(seq_len: int, emb_dim: int, device: torch.device, *, forward_only: bool = False) -> int:
    """Rows (sequences) per pass chosen for speed at bounded memory.

    About 3M embedding elements per forward+backward pass on CPU (e.g. 209 sequences of 50 tokens × 300),
    64M on a GPU; twice that for forward-only passes. On CPU, throughput of the reference BiLSTM is flat
    from ~100 to ~400 sequences per pass and drops beyond (activations leave the cache) while memory grows
    linearly, so this sits at the measured floor without tuning, at a small fraction of the memory of
    running all steps at once.

    Example:
        >>> auto_internal_batch_size(50, 300, torch.device("cpu"))
        209
    """
    budget = _GPU_BUDGET if torch.device(device).type == "cuda" else _CPU_BUDGET
    if forward_only:
        budget *= 2
    return max(1, budget // max(1, seq_len * emb_dim))


def _rows_per_pass(value: Any, seq_len: int, emb_dim: int, device: torch.device, forward_only: bool = False) -> int:
    if value is None or value == "auto":
        return auto_internal_batch_size(seq_len, emb_dim, device, forward_only=forward_only)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"internal_batch_size must be a positive int or 'auto'; got {value!r}.")
    return value


def _embed(model: ExplainableModel, batch: Batch, create_graph: bool) -> Tensor:
    if create_graph:
        return model.embed(batch)
    with torch.no_grad():
        return model.embed(batch).detach()


# the last input gradient computed inside ``shared_input_gradients`` (None: sharing is off)
_shared: Optional[List[Any]] = None


@contextmanager
def shared_input_gradients() -> Iterator[None]:
    """Let ``gradient`` and ``grad_x_input`` calls on the same inputs share one forward+backward pass.

    Inside the context the last input gradient is kept; a later call whose model, batch values, embeddings, token
    mask, target, ``output`` and ``detach_attention`` are equal reuses it instead of recomputing it — the two maps of
    an audit then cost one backward pass, not two. The model's weights must not change inside the context
    (audits guarantee this). Graph-building calls (``create_graph=True``) are never shared.

    Example:
        >>> import torch
        >>> from lightning_xai.attribution import attribute
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> with shared_input_gradients():
        ...     g = attribute(model, batch, "gradient")
        ...     gxi = attribute(model, batch, "grad_x_input")  # reuses the gradient above
        >>> torch.allclose(gxi, attribute(model, batch, "grad_x_input"))
        True
    """
    global _shared
    previous, _shared = _shared, []
    try:
        yield
    finally:
        _shared = previous


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    return a == b


def _same_batch(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two batches hold the same values (tensors compared by value): inputs besides the embeddings (a
    decoder's, a target's) change the gradient too."""
    return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)


def _same_value(a: Any, b: Any) -> bool:
    if a is b or isinstance(a, Tensor) or isinstance(b, Tensor):
        return a is b or _same(a, b)
    try:  # a value whose == is not a bool (a numpy array, a list of tensors) counts as different: recomputed
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


def _input_gradients(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    target: Any,
    *,
    output: Optional[str],
    create_graph: bool,
    detach_attention: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(grad [N, T, E], inputs the grad is w.r.t., resolved target)`` of the target score.

    With ``detach_attention`` the attention distribution is computed first and fed back as a constant
    ``attention_override`` (Jain & Wallace's gradient), so no gradient flows through the attention scorer.
    """
    sharing = _shared is not None and not create_graph
    if sharing and _shared:
        key, cached = _shared
        if (
            key[0] is model
            and key[1:3] == (output, detach_attention)
            and _same(key[3], target)
            and _same(key[4], embeddings)
            and _same(key[5], model.token_mask(batch))
            and _same_batch(key[6], batch)
        ):
            return cached
    result = _compute_input_gradients(
        model, batch, embeddings, target, output=output, create_graph=create_graph, detach_attention=detach_attention
    )
    if sharing:
        assert _shared is not None  # sharing says so
        key = (model, output, detach_attention, target, embeddings.detach(), model.token_mask(batch), dict(batch))
        _shared[:] = [key, result]
    return result


def _compute_input_gradients(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    target: Any,
    *,
    output: Optional[str],
    create_graph: bool,
    detach_attention: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    if create_graph and embeddings.requires_grad:
        inputs = embeddings
    else:
        inputs = embeddings.detach().requires_grad_(True)
    override = None
    if detach_attention:
        with torch.no_grad():
            override = model.forward_from_embeddings(inputs.detach(), batch).attention.detach()
    out = model.forward_from_embeddings(inputs, batch, attention_override=override)
    target = resolve_target(out, target)
    score = target_score(out, target, output, head_kind_of(model))
    (grad,) = torch.autograd.grad(score.sum(), inputs, create_graph=create_graph)
    return grad, inputs, target


def _safe_l2(grad: Tensor) -> Tensor:
    # the norm's derivative is undefined at 0 (pads): give it 0 there so double backward stays finite; elsewhere
    # keep ``squared`` itself (0 at 0, NaN at NaN: a NaN gradient must stay NaN, never become a finite 0)
    squared = grad.pow(2).sum(dim=-1)
    positive = squared > 0
    return torch.where(positive, squared.where(positive, torch.ones_like(squared)).sqrt(), squared)


# --- kernels: (model, batch, embeddings, target) -> [N, T]; reused by SmoothGrad on noisy embeddings ------------
def gradient_map(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    target: Any,
    *,
    create_graph: bool = False,
    reduction: str = "l2",
    output: Optional[str] = None,
    detach_attention: bool = False,
) -> Tensor:
    """‖∂ score/∂e_t‖₂ (``"l2"``) or Σ_E \\|∂ score/∂e_t\\| (``"abs_sum"``) for each token."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"Unknown reduction {reduction!r} for 'gradient'; choose one of {list(REDUCTIONS)}.")
    grad, _, _ = _input_gradients(
        model, batch, embeddings, target, output=output, create_graph=create_graph, detach_attention=detach_attention
    )
    return _safe_l2(grad) if reduction == "l2" else grad.abs().sum(dim=-1)


def grad_x_input_map(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    target: Any,
    *,
    create_graph: bool = False,
    output: Optional[str] = None,
    absolute: bool = False,
    detach_attention: bool = False,
) -> Tensor:
    """Σ_E (∂ score/∂e_t)·e_t (Jain & Wallace: ``output="probability"``, ``absolute=True``, ``detach_attention=True``)."""
    grad, inputs, _ = _input_gradients(
        model, batch, embeddings, target, output=output, create_graph=create_graph, detach_attention=detach_attention
    )
    scores = (grad * inputs).sum(dim=-1)
    return scores.abs() if absolute else scores


# --- registered methods ---------------------------------------------------------------------------------------
@register_method("attention", resolves_target=True)
def attention_map(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False) -> Tensor:
    """The model's attention distribution ``[B, T]`` (``target`` is only validated; for generation a target step
    selects that step's attention row, :func:`~lightning_xai.attribution.targets.explained_attention`)."""
    with nullcontext() if create_graph else torch.no_grad():
        out = model.forward_from_embeddings(model.embed(batch), batch)
    attention = explained_attention(out, resolve_target(out, target))
    check_attention_distribution(attention, model.token_mask(batch), source=f"{type(model).__name__}'s attention")
    return attention


@register_method("gradient", resolves_target=True)
def _gradient(
    model: ExplainableModel,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    reduction: str = "l2",
    output: Optional[str] = None,
    detach_attention: bool = False,
) -> Tensor:
    return gradient_map(
        model,
        batch,
        _embed(model, batch, create_graph),
        target,
        create_graph=create_graph,
        reduction=reduction,
        output=output,
        detach_attention=detach_attention,
    )


@register_method("grad_x_input", resolves_target=True)
def _grad_x_input(
    model: ExplainableModel,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    output: Optional[str] = None,
    absolute: bool = False,
    detach_attention: bool = False,
) -> Tensor:
    return grad_x_input_map(
        model,
        batch,
        _embed(model, batch, create_graph),
        target,
        create_graph=create_graph,
        output=output,
        absolute=absolute,
        detach_attention=detach_attention,
    )

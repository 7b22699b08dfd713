"""Gradient-based token attributions: attention (for reference), gradient, grad×input, IG and SmoothGrad.

All gradients are taken w.r.t. the model's input embeddings (``model.embed(batch)``) with
:func:`torch.autograd.grad`; parameters' ``.grad`` are never touched. Without ``create_graph`` the embeddings
are a detached leaf and the parameters are frozen (faster); with ``create_graph=True`` the embeddings stay
connected to the embedding table and every map is differentiable w.r.t. all parameters.
"""
from __future__ import annotations

import inspect
import math
import warnings
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution.batching import pad_embeddings, take_rows
from lightning_xai.attribution.core import register_method, resolve_target, target_score

__all__ = ["IG_RULES", "GRADIENT_METHODS", "auto_internal_batch_size", "ig_nodes", "attention_map",
           "gradient_map", "grad_x_input_map", "integrated_gradients_map", "smooth_grad_map"]

IG_RULES = ("gauss_legendre", "riemann_left", "riemann_middle", "riemann_right", "riemann_trapezoid")
BASELINES = ("zero", "pad")
REDUCTIONS = ("l2", "abs_sum")
#: elements of the ``[rows, T, E]`` embedding block handled per forward/backward pass by default
_CPU_BUDGET = 3 * 2 ** 20
_GPU_BUDGET = 2 ** 26


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


def ig_nodes(n_steps: int, rule: str = "gauss_legendre") -> Tuple[np.ndarray, np.ndarray]:
    """``(alphas, weights)`` of the quadrature rule on [0, 1], in float64.

    Gauss–Legendre nodes come from :func:`numpy.polynomial.legendre.leggauss` mapped from [-1, 1]; the Riemann
    rules use the same points as Captum (left: i/n, right: (i+1)/n, middle: (i+½)/n, trapezoid: n points
    from 0 to 1 with half weights at the ends).

    Example:
        >>> a, w = ig_nodes(2)
        >>> [round(float(x), 6) for x in a], w.tolist()
        ([0.211325, 0.788675], [0.5, 0.5])
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"n_steps must be a positive int (or 'auto'); got {n_steps!r}.")
    n = int(n_steps)
    if rule == "gauss_legendre":
        x, w = np.polynomial.legendre.leggauss(n)
        return 0.5 * (x + 1.0), 0.5 * w
    if rule not in IG_RULES:
        raise ValueError(f"Unknown IG rule {rule!r}; choose one of {list(IG_RULES)}.")
    if n < 2:
        raise ValueError(f"The {rule} rule needs n_steps >= 2; got {n}.")
    weights = np.full(n, 1.0 / n)
    if rule == "riemann_left":
        alphas = np.arange(n) / n
    elif rule == "riemann_right":
        alphas = np.arange(1, n + 1) / n
    elif rule == "riemann_middle":
        alphas = (np.arange(n) + 0.5) / n
    else:
        alphas = np.linspace(0.0, 1.0, n)
        weights[0] /= 2
        weights[-1] /= 2
    return alphas, weights


def _embed(model: ExplainableModel, batch: Batch, create_graph: bool) -> Tensor:
    if create_graph:
        return model.embed(batch)
    with torch.no_grad():
        return model.embed(batch).detach()


def _input_gradients(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *, output: str,
                     create_graph: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """``(grad [N, T, E], inputs the grad is w.r.t., resolved target)`` of the target score."""
    if create_graph and embeddings.requires_grad:
        inputs = embeddings
    else:
        inputs = embeddings.detach().requires_grad_(True)
    logits = model.forward_from_embeddings(inputs, batch).logits
    target = resolve_target(logits, target)
    score = target_score(logits, target, output)
    (grad,) = torch.autograd.grad(score.sum(), inputs, create_graph=create_graph)
    return grad, inputs, target


def _safe_l2(grad: Tensor) -> Tensor:
    # the norm's derivative is undefined at 0 (pads): give it 0 there so double backward stays finite
    squared = grad.pow(2).sum(dim=-1)
    positive = squared > 0
    return torch.where(positive, squared.where(positive, torch.ones_like(squared)).sqrt(), torch.zeros_like(squared))


# --- kernels: (model, batch, embeddings, target) -> [N, T]; reused by SmoothGrad on noisy embeddings ------------
def gradient_map(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *,
                 create_graph: bool = False, reduction: str = "l2", output: str = "probability") -> Tensor:
    """‖∂ score/∂e_t‖₂ (``"l2"``) or Σ_E \\|∂ score/∂e_t\\| (``"abs_sum"``) for each token."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"Unknown reduction {reduction!r} for 'gradient'; choose one of {list(REDUCTIONS)}.")
    grad, _, _ = _input_gradients(model, batch, embeddings, target, output=output, create_graph=create_graph)
    return _safe_l2(grad) if reduction == "l2" else grad.abs().sum(dim=-1)


def grad_x_input_map(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *,
                     create_graph: bool = False, output: str = "probability", absolute: bool = False) -> Tensor:
    """Σ_E (∂ score/∂e_t)·e_t (Jain & Wallace use ``output="probability"`` and ``absolute=True``)."""
    grad, inputs, _ = _input_gradients(model, batch, embeddings, target, output=output, create_graph=create_graph)
    scores = (grad * inputs).sum(dim=-1)
    return scores.abs() if absolute else scores


def _baseline(model: ExplainableModel, batch: Batch, embeddings: Tensor, baseline: Any,
              pad_token_id: Optional[int]) -> Tensor:
    mask = model.token_mask(batch).unsqueeze(-1)
    if isinstance(baseline, Tensor):
        if baseline.shape != embeddings.shape:
            raise ValueError(f"A baseline tensor must have the embeddings' shape {tuple(embeddings.shape)}; got "
                             f"{tuple(baseline.shape)}.")
        return torch.where(mask, baseline.to(embeddings), embeddings)
    if baseline == "zero":
        return torch.where(mask, torch.zeros_like(embeddings), embeddings)
    if baseline == "pad":
        return pad_embeddings(model, batch, embeddings, pad_token_id=pad_token_id)
    raise ValueError(f"Unknown baseline {baseline!r}; choose one of {list(BASELINES)} or pass a [B, T, E] tensor.")


def _ig_path(model: ExplainableModel, batch: Batch, embeddings: Tensor, base: Tensor, target: Tensor,
             alphas: np.ndarray, weights: np.ndarray, *, output: str, create_graph: bool, rows: int) -> Tensor:
    """Σ_E (e − e′)·Σ_k w_k ∂F/∂e(e′ + α_k(e − e′)), all (step, row) pairs batched ``rows`` at a time."""
    B = embeddings.shape[0]
    alpha = torch.as_tensor(alphas, dtype=embeddings.dtype, device=embeddings.device)
    weight = torch.as_tensor(weights, dtype=embeddings.dtype, device=embeddings.device)
    diff = embeddings - base
    acc = torch.zeros_like(embeddings) if not create_graph else None
    pieces: List[Tensor] = []
    total = len(alphas) * B
    cache: Dict[Tuple[int, int], Tuple[Tensor, Dict[str, Any]]] = {}
    for start in range(0, total, rows):
        stop = min(total, start + rows)
        key = (start % B, stop - start)
        if key not in cache:
            row = torch.arange(start, stop, device=embeddings.device) % B
            cache = {key: (row, take_rows(batch, row, B))}  # keep only the latest layout
        row, sub = cache[key]
        step = torch.arange(start, stop, device=embeddings.device) // B
        x = base.index_select(0, row) + alpha[step].view(-1, 1, 1) * diff.index_select(0, row)
        if not create_graph:
            x = x.detach().requires_grad_(True)
        logits = model.forward_from_embeddings(x, sub).logits
        score = target_score(logits, target.index_select(0, row), output)
        (grad,) = torch.autograd.grad(score.sum(), x, create_graph=create_graph)
        weighted = grad * weight[step].view(-1, 1, 1)
        if create_graph:
            pieces.append(torch.zeros_like(embeddings).index_add(0, row, weighted))
        else:
            acc.index_add_(0, row, weighted.detach())
    summed = torch.stack(pieces).sum(0) if create_graph else acc
    return (diff * summed).sum(dim=-1)


def integrated_gradients_map(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *,
                             create_graph: bool = False, n_steps: Union[int, str] = 50, baseline: Any = "zero",
                             rule: str = "gauss_legendre", internal_batch_size: Union[int, str, None] = "auto",
                             output: str = "probability", rtol: float = 0.01, atol: float = 1e-6,
                             max_steps: int = 256, start_steps: int = 6, pad_token_id: Optional[int] = None,
                             warn_threshold: float = 0.05) -> Tuple[Tensor, Tensor, Tensor]:
    """IG over embeddings; returns ``(map [N, T], delta [N], n_steps [N])``. See :func:`attribute`."""
    if rule not in IG_RULES:
        raise ValueError(f"Unknown IG rule {rule!r}; choose one of {list(IG_RULES)}.")
    N, T, E = embeddings.shape
    rows = _rows_per_pass(internal_batch_size, T, E, embeddings.device)
    mask = model.token_mask(batch)
    base = _baseline(model, batch, embeddings, baseline, pad_token_id)
    with torch.no_grad():
        logits_x = model.forward_from_embeddings(embeddings, batch).logits
        target = resolve_target(logits_x, target)
        gap = target_score(logits_x, target, output) - target_score(
            model.forward_from_embeddings(base, batch).logits, target, output)

    def run(idx: Optional[Tensor], n: int) -> Tensor:
        alphas, weights = ig_nodes(n, rule)
        if idx is None:
            return _ig_path(model, batch, embeddings, base, target, alphas, weights, output=output,
                            create_graph=create_graph, rows=rows)
        return _ig_path(model, take_rows(batch, idx, N), embeddings.index_select(0, idx), base.index_select(0, idx),
                        target.index_select(0, idx), alphas, weights, output=output, create_graph=create_graph,
                        rows=rows)

    if n_steps == "auto":
        if not 0 < rtol < 1:
            raise ValueError(f"rtol must lie in (0, 1); got {rtol}.")
        n = int(start_steps)
        if n < (1 if rule == "gauss_legendre" else 2) or max_steps < n:
            raise ValueError(f"need 1 <= start_steps <= max_steps; got start_steps={start_steps}, "
                             f"max_steps={max_steps}.")
        scores = torch.zeros(N, T, dtype=embeddings.dtype, device=embeddings.device)
        steps = torch.zeros(N, dtype=torch.long, device=embeddings.device)
        active = torch.arange(N, device=embeddings.device)
        tolerance = torch.clamp(rtol * gap.abs(), min=atol)
        while active.numel():
            part = run(None if active.numel() == N else active, n).masked_fill(~mask.index_select(0, active), 0.0)
            delta = part.detach().sum(1) - gap.index_select(0, active)
            done = (delta.abs() <= tolerance.index_select(0, active)) | (n >= max_steps)
            finished = active[done]
            scores = scores.index_copy(0, finished, part[done])
            steps[finished] = n
            active = active[~done]
            n = min(2 * n, max_steps)
        unconverged = int(((scores.detach().sum(1) - gap).abs() > tolerance).sum())
        if unconverged:
            warnings.warn(f"n_steps='auto': {unconverged} of {N} rows missed the completeness tolerance "
                          f"(rtol={rtol}) at max_steps={max_steps}; raise max_steps.", RuntimeWarning, stacklevel=4)
    else:
        scores = run(None, n_steps).masked_fill(~mask, 0.0)
        steps = torch.full((N,), int(n_steps), dtype=torch.long, device=embeddings.device)
    delta = scores.detach().sum(1) - gap
    floor = math.sqrt(torch.finfo(embeddings.dtype).eps)
    bad = (delta.abs() > warn_threshold * gap.abs()) & (delta.abs() > floor)
    if bool(bad.any()):
        ratio = (delta.abs() / gap.abs().clamp_min(torch.finfo(gap.dtype).tiny))[bad].max().item()
        warnings.warn(f"Integrated gradients: convergence delta exceeds {warn_threshold:.0%} of |F(x) - F(x')| "
                      f"for {int(bad.sum())} of {N} rows (worst {ratio:.1%}); raise n_steps or use "
                      "n_steps='auto'.", RuntimeWarning, stacklevel=4)
    return scores, delta, steps


def smooth_grad_map(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *,
                    create_graph: bool = False, n_samples: int = 30, noise_level: float = 0.15,
                    stdev: Optional[float] = None, seed: Optional[int] = 0, generator: Optional[torch.Generator] = None,
                    noise: Optional[Tensor] = None, base_method: str = "gradient",
                    internal_batch_size: Union[int, str, None] = "auto", **base_options: Any) -> Tensor:
    """Mean of ``base_method``'s maps over ``n_samples`` noisy copies of the embeddings. See :func:`attribute`."""
    if base_method not in GRADIENT_METHODS:
        raise ValueError(f"Unknown base_method {base_method!r} for smooth_grad; choose one of "
                         f"{sorted(GRADIENT_METHODS)}.")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive int; got {n_samples!r}.")
    kernel = GRADIENT_METHODS[base_method]
    signature = inspect.signature(integrated_gradients_map if base_method == "integrated_gradients" else kernel)
    accepted = sorted(n for n, p in signature.parameters.items()
                      if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in ("create_graph", "internal_batch_size"))
    unknown = sorted(set(base_options) - set(accepted))
    if unknown:
        raise TypeError(f"smooth_grad got unknown option(s) {unknown}; it accepts n_samples, noise_level, stdev, seed, "
                        f"generator, noise, base_method, internal_batch_size and {base_method!r}'s options {accepted}.")
    N, T, E = embeddings.shape
    mask = model.token_mask(batch)
    with torch.no_grad():
        target = resolve_target(model.forward_from_embeddings(embeddings, batch).logits, target)
    if noise is not None:
        if tuple(noise.shape) != (n_samples, N, T, E):
            raise ValueError(f"noise must have shape (n_samples, B, T, E) = {(n_samples, N, T, E)}; got "
                             f"{tuple(noise.shape)}.")
        sigma = None
    else:
        if stdev is not None:
            sigma = torch.full((N,), float(stdev), dtype=embeddings.dtype, device=embeddings.device)
        else:
            real = mask.unsqueeze(-1)
            values = embeddings.detach()
            top = values.masked_fill(~real, float("-inf")).amax(dim=(1, 2))
            bottom = values.masked_fill(~real, float("inf")).amin(dim=(1, 2))
            sigma = noise_level * (top - bottom)
        if generator is None:
            generator = torch.Generator(device=embeddings.device)
            generator.manual_seed(0 if seed is None else int(seed))
    per_pass = 1 if base_method == "integrated_gradients" else max(
        1, _rows_per_pass(internal_batch_size, T, E, embeddings.device) // N)
    if base_method == "integrated_gradients":
        base_options.setdefault("internal_batch_size", internal_batch_size)
    real = mask.unsqueeze(-1).to(embeddings.dtype)
    total: Optional[Tensor] = None
    for first in range(0, n_samples, per_pass):
        k = min(per_pass, n_samples - first)
        if noise is not None:
            eps = noise[first:first + k].to(embeddings)
        else:
            # one draw per sample, so the noise does not depend on how samples are grouped into passes
            eps = torch.stack([torch.randn(embeddings.shape, generator=generator, dtype=embeddings.dtype,
                                           device=embeddings.device) for _ in range(k)]) * sigma.view(1, N, 1, 1)
        noisy = (embeddings.unsqueeze(0) + eps * real).reshape(k * N, T, E)
        row = torch.arange(N, device=embeddings.device).repeat(k)
        sub = batch if k == 1 else take_rows(batch, row, N)
        maps = kernel(model, sub, noisy, target.index_select(0, row), create_graph=create_graph, **base_options)
        if isinstance(maps, tuple):
            maps = maps[0]
        summed = maps.view(k, N, T).sum(0)
        total = summed if total is None else total + summed
    return total / n_samples


def _ig_kernel(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, **options: Any) -> Tensor:
    return integrated_gradients_map(model, batch, embeddings, target, **options)[0]


GRADIENT_METHODS: Dict[str, Callable[..., Tensor]] = {
    "gradient": gradient_map, "grad_x_input": grad_x_input_map, "integrated_gradients": _ig_kernel}


# --- registered methods ---------------------------------------------------------------------------------------
@register_method("attention", resolves_target=True)
def attention_map(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False) -> Tensor:
    """The model's attention distribution ``[B, T]`` (``target`` is only validated)."""
    with nullcontext() if create_graph else torch.no_grad():
        out = model.forward_from_embeddings(model.embed(batch), batch)
    resolve_target(out.logits, target)
    return out.attention


@register_method("gradient", resolves_target=True)
def _gradient(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False,
              reduction: str = "l2", output: str = "probability") -> Tensor:
    return gradient_map(model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph,
                        reduction=reduction, output=output)


@register_method("grad_x_input", resolves_target=True)
def _grad_x_input(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False,
                  output: str = "probability", absolute: bool = False) -> Tensor:
    return grad_x_input_map(model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph,
                            output=output, absolute=absolute)


@register_method("integrated_gradients", resolves_target=True)
def _integrated_gradients(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False,
                          n_steps: Union[int, str] = 50, baseline: Any = "zero", rule: str = "gauss_legendre",
                          internal_batch_size: Union[int, str, None] = "auto",
                          return_convergence_delta: bool = False, return_n_steps: bool = False,
                          output: str = "probability", rtol: float = 0.01, atol: float = 1e-6,
                          max_steps: int = 256, start_steps: int = 6, pad_token_id: Optional[int] = None,
                          warn_threshold: float = 0.05) -> Union[Tensor, Tuple[Tensor, ...]]:
    if not (n_steps == "auto" or isinstance(n_steps, (int, np.integer))) or isinstance(n_steps, bool):
        raise ValueError(f"n_steps must be a positive int or 'auto'; got {n_steps!r}.")
    scores, delta, steps = integrated_gradients_map(
        model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph, n_steps=n_steps,
        baseline=baseline, rule=rule, internal_batch_size=internal_batch_size, output=output, rtol=rtol, atol=atol,
        max_steps=max_steps, start_steps=start_steps, pad_token_id=pad_token_id, warn_threshold=warn_threshold)
    extras: Sequence[Tensor] = ([delta] if return_convergence_delta else []) + ([steps] if return_n_steps else [])
    return (scores, *extras) if extras else scores


@register_method("smooth_grad", resolves_target=True)
def _smooth_grad(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False,
                 **options: Any) -> Tensor:
    return smooth_grad_map(model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph,
                           **options)

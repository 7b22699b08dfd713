"""SmoothGrad (Smilkov et al., 2017): the mean map of a gradient method over noisy copies of the embeddings."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Union

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution.batching import repeat_rows
from lightning_xai.attribution.gradients import _embed, _rows_per_pass, grad_x_input_map, gradient_map
from lightning_xai.attribution.integrated_gradients import integrated_gradients_map
from lightning_xai.attribution.registry import register_method
from lightning_xai.attribution.targets import resolve_target

__all__ = ["GRADIENT_METHODS", "smooth_grad_map"]


def _ig_kernel(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, **options: Any) -> Tensor:
    return integrated_gradients_map(model, batch, embeddings, target, **options)[0]


GRADIENT_METHODS: Dict[str, Callable[..., Tensor]] = {
    "gradient": gradient_map,
    "grad_x_input": grad_x_input_map,
    "integrated_gradients": _ig_kernel,
}


def smooth_grad_map(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    target: Any,
    *,
    create_graph: bool = False,
    n_samples: int = 30,
    noise_level: float = 0.15,
    stdev: Optional[float] = None,
    seed: Optional[int] = 0,
    generator: Optional[torch.Generator] = None,
    noise: Optional[Tensor] = None,
    base_method: str = "gradient",
    internal_batch_size: Union[int, str, None] = "auto",
    **base_options: Any,
) -> Tensor:
    """Mean of ``base_method``'s maps over ``n_samples`` noisy copies of the embeddings. See :func:`attribute`."""
    if base_method not in GRADIENT_METHODS:
        raise ValueError(
            f"Unknown base_method {base_method!r} for smooth_grad; choose one of {sorted(GRADIENT_METHODS)}."
        )
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive int; got {n_samples!r}.")
    kernel = GRADIENT_METHODS[base_method]
    signature = inspect.signature(integrated_gradients_map if base_method == "integrated_gradients" else kernel)
    accepted = sorted(
        n
        for n, p in signature.parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and n not in ("create_graph", "internal_batch_size")
    )
    unknown = sorted(set(base_options) - set(accepted))
    if unknown:
        raise TypeError(
            f"smooth_grad got unknown option(s) {unknown}; it accepts n_samples, noise_level, stdev, seed, "
            f"generator, noise, base_method, internal_batch_size and {base_method!r}'s options {accepted}."
        )
    N, T, E = embeddings.shape
    mask = model.token_mask(batch)
    with torch.no_grad():
        target = resolve_target(model.forward_from_embeddings(embeddings, batch), target)
    if noise is not None:
        if tuple(noise.shape) != (n_samples, N, T, E):
            raise ValueError(
                f"noise must have shape (n_samples, B, T, E) = {(n_samples, N, T, E)}; got {tuple(noise.shape)}."
            )
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
    per_pass = (
        1
        if base_method == "integrated_gradients"
        else max(1, _rows_per_pass(internal_batch_size, T, E, embeddings.device) // N)
    )
    if base_method == "integrated_gradients":
        base_options.setdefault("internal_batch_size", internal_batch_size)
    real = mask.unsqueeze(-1).to(embeddings.dtype)
    total: Optional[Tensor] = None
    for first in range(0, n_samples, per_pass):
        k = min(per_pass, n_samples - first)
        if noise is not None:
            eps = noise[first : first + k].to(embeddings)
        else:
            assert sigma is not None  # set above when no noise is given
            # one draw per sample, so the noise does not depend on how samples are grouped into passes
            eps = torch.stack(
                [
                    torch.randn(embeddings.shape, generator=generator, dtype=embeddings.dtype, device=embeddings.device)
                    for _ in range(k)
                ]
            ) * sigma.view(1, N, 1, 1)
        noisy = (embeddings.unsqueeze(0) + eps * real).reshape(k * N, T, E)
        row = torch.arange(N, device=embeddings.device).repeat(k)
        sub = batch if k == 1 else repeat_rows(batch, k, N)
        maps = kernel(model, sub, noisy, target.index_select(0, row), create_graph=create_graph, **base_options)
        if isinstance(maps, tuple):
            maps = maps[0]
        summed = maps.view(k, N, T).sum(0)
        total = summed if total is None else total + summed
    assert total is not None  # n_samples >= 1 (checked above)
    return total / n_samples


@register_method("smooth_grad", resolves_target=True)
def _smooth_grad(
    model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False, **options: Any
) -> Tensor:
    return smooth_grad_map(
        model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph, **options
    )

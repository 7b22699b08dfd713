"""Smooth attention (Ding & Koehn 2019): the attention distribution averaged over Gaussian-noised embeddings.

The attention twin of SmoothGrad, with the same noise convention as ``smooth_grad``
(:func:`~lightning_xai.attribution.smooth_grad.smooth_grad_map`): every real token's embedding gets
N(0, σ²) noise, σ = ``noise_level``·(max − min) of the row's real-token embedding entries (or ``stdev``), pads and
special tokens are left as they are, and the draws come from a generator seeded with ``seed`` (one draw of
shape ``[B, T, E]`` per sample, so the noise does not depend on how samples are grouped into passes).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Optional, Union

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.attribution.core import resolve_target
from lightning_xai.attribution.gradients import _rows_per_pass
from lightning_xai.attribution.registry import register_method
from lightning_xai.attribution.targets import explained_attention

__all__ = ["noise_scale", "smooth_attention_map"]


def noise_scale(embeddings: Tensor, mask: Tensor, noise_level: float = 0.15, stdev: Optional[float] = None) -> Tensor:
    """``[B]`` noise standard deviation per row: ``stdev``, else ``noise_level``·(max − min) over real tokens.

    Example:
        >>> emb = torch.tensor([[[0.0, 1.0], [3.0, -1.0], [9.0, 9.0]]])
        >>> noise_scale(emb, torch.tensor([[True, True, False]]), noise_level=0.5)  # (3 − (−1)) / 2, pad ignored
        tensor([2.])
    """
    if stdev is not None:
        if stdev < 0:
            raise ValueError(f"stdev must be >= 0; got {stdev}.")
        return embeddings.new_full((embeddings.shape[0],), float(stdev))
    if noise_level < 0:
        raise ValueError(f"noise_level must be >= 0; got {noise_level}.")
    real = mask.unsqueeze(-1).expand_as(embeddings)
    values = embeddings.detach()
    spread = (
        torch.where(real, values, values.new_tensor(float("-inf"))).flatten(1).max(1).values
        - torch.where(real, values, values.new_tensor(float("inf"))).flatten(1).min(1).values
    )
    return noise_level * spread


def _draw(embeddings: Tensor, sigma: Tensor, generator: torch.Generator, k: int) -> Tensor:
    """``[k, B, T, E]`` noise: ``k`` successive ``[B, T, E]`` standard normal draws, each scaled by its row's σ."""
    draws = [
        torch.randn(embeddings.shape, generator=generator, dtype=embeddings.dtype, device=embeddings.device)
        for _ in range(k)
    ]
    return torch.stack(draws) * sigma


def smooth_attention_map(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    *,
    n_samples: int = 30,
    noise_level: float = 0.15,
    stdev: Optional[float] = None,
    seed: Optional[int] = 0,
    generator: Optional[torch.Generator] = None,
    noise: Optional[Tensor] = None,
    internal_batch_size: Union[int, str, None] = "auto",
    create_graph: bool = False,
    target: Optional[Tensor] = None,
) -> Tensor:
    """Mean ``[B, T]`` attention of the model over ``n_samples`` noisy copies of ``embeddings``.

    Args:
        model: an explainable model.
        batch: its batch.
        embeddings: ``[B, T, E]`` the clean input embeddings.
        n_samples: noisy copies averaged.
        noise_level: σ as a share of each row's real-token embedding range (Ding & Koehn / SmoothGrad: 0.15).
        stdev: an absolute σ for every row instead (overrides ``noise_level``).
        seed: seed of the noise generator (ignored when ``generator`` or ``noise`` is given).
        generator: a ``torch.Generator`` on the embeddings' device to draw from.
        noise: ``[n_samples, B, T, E]`` explicit noise, added as it is (only on real tokens).
        internal_batch_size: noisy rows per forward pass (``"auto"``: sized like the gradient methods' passes).
        create_graph: keep the graph (the mean stays differentiable w.r.t. parameters).
        target: a resolved ``LongTensor[B]`` target; for a generation model a step ``k`` averages that step's
            attention row (:func:`~lightning_xai.attribution.targets.explained_attention`), else it is unused.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> emb = model.embed(batch).detach()
        >>> smooth = smooth_attention_map(model, batch, emb, n_samples=4, noise_level=0.0)
        >>> bool(torch.allclose(smooth, model(batch).attention.detach()))
        True
    """
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive int; got {n_samples!r}.")
    N, T, E = embeddings.shape
    mask = model.token_mask(batch)
    real = mask.unsqueeze(-1).to(embeddings.dtype)
    if noise is not None:
        if tuple(noise.shape) != (n_samples, N, T, E):
            raise ValueError(
                f"noise must have shape (n_samples, B, T, E) = {(n_samples, N, T, E)}; got {tuple(noise.shape)}."
            )
    else:
        sigma = noise_scale(embeddings, mask, noise_level, stdev).view(N, 1, 1)
        if generator is None:
            generator = torch.Generator(device=embeddings.device).manual_seed(0 if seed is None else int(seed))
    rows = _rows_per_pass(internal_batch_size, T, E, embeddings.device, forward_only=not create_graph)
    per_pass = max(1, rows // N)
    total: Optional[Tensor] = None
    with nullcontext() if create_graph else torch.no_grad():
        for first in range(0, n_samples, per_pass):
            k = min(per_pass, n_samples - first)
            if noise is not None:
                eps = noise[first : first + k].to(embeddings)
            else:
                assert generator is not None  # made above when no noise is given
                eps = _draw(embeddings, sigma, generator, k)
            noisy = (embeddings.unsqueeze(0) + eps * real).reshape(k * N, T, E)
            sub = batch if k == 1 else gather_rows(batch, torch.arange(N, device=embeddings.device).repeat(k), N)
            out = model.forward_from_embeddings(noisy, sub)
            attention = explained_attention(out, None if target is None else target.repeat(k))
            part = attention.reshape(k, N, T).sum(0)
            total = part if total is None else total + part
    assert total is not None  # n_samples >= 1 (checked above)
    return total / n_samples


@register_method("smooth_attention", resolves_target=True)
def _smooth_attention(
    model: ExplainableModel,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    n_samples: int = 30,
    noise_level: float = 0.15,
    stdev: Optional[float] = None,
    seed: Optional[int] = 0,
    generator: Optional[torch.Generator] = None,
    noise: Optional[Tensor] = None,
    internal_batch_size: Union[int, str, None] = "auto",
) -> Tensor:
    with nullcontext() if create_graph else torch.no_grad():
        embeddings = model.embed(batch)
        target = resolve_target(model.forward_from_embeddings(embeddings, batch), target)
    if not create_graph:
        embeddings = embeddings.detach()
    return smooth_attention_map(
        model,
        batch,
        embeddings,
        n_samples=n_samples,
        noise_level=noise_level,
        stdev=stdev,
        seed=seed,
        generator=generator,
        noise=noise,
        internal_batch_size=internal_batch_size,
        create_graph=create_graph,
        target=target,
    )

"""The path integral behind Integrated Gradients: the baseline, the straight-line path's integrand, and the adaptive
Gauss–Kronrod rule of ``n_steps="auto"`` (used by :mod:`lightning_xai.attribution.integrated_gradients` and by
Integrated Hessians' baselines in :mod:`lightning_xai.attribution.interactions`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.adapters.sharding import agree
from lightning_xai.attribution.batching import gather_rows, pad_embeddings
from lightning_xai.attribution.quadrature import gauss_kronrod_nodes
from lightning_xai.attribution.targets import target_score

__all__ = ["BASELINES"]

BASELINES = ("zero", "pad")


def _baseline(
    model: ExplainableModel, batch: Batch, embeddings: Tensor, baseline: Any, pad_token_id: Optional[int]
) -> Tensor:
    mask = model.token_mask(batch).unsqueeze(-1)
    if isinstance(baseline, Tensor):
        if baseline.shape != embeddings.shape:
            raise ValueError(
                f"A baseline tensor must have the embeddings' shape {tuple(embeddings.shape)}; got "
                f"{tuple(baseline.shape)}."
            )
        return torch.where(mask, baseline.to(embeddings), embeddings)
    if baseline == "zero":
        return torch.where(mask, torch.zeros_like(embeddings), embeddings)
    if baseline == "pad":
        return pad_embeddings(model, batch, embeddings, pad_token_id=pad_token_id)
    raise ValueError(f"Unknown baseline {baseline!r}; choose one of {list(BASELINES)} or pass a [B, T, E] tensor.")


def _ig_path(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    base: Tensor,
    target: Tensor,
    alphas: np.ndarray,
    weights: np.ndarray,
    *,
    output: Optional[str],
    create_graph: bool,
    rows: int,
) -> Tensor:
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
            cache = {key: (row, gather_rows(batch, row, B))}  # keep only the latest layout
        row, sub = cache[key]
        step = torch.arange(start, stop, device=embeddings.device) // B
        x = base.index_select(0, row) + alpha[step].view(-1, 1, 1) * diff.index_select(0, row)
        if not create_graph:
            x = x.detach().requires_grad_(True)
        out = model.forward_from_embeddings(x, sub)
        score = target_score(out, target.index_select(0, row), output, head_kind_of(model))
        (grad,) = torch.autograd.grad(score.sum(), x, create_graph=create_graph)
        weighted = grad * weight[step].view(-1, 1, 1)
        if acc is None:  # create_graph
            pieces.append(torch.zeros_like(embeddings).index_add(0, row, weighted))
        else:
            acc.index_add_(0, row, weighted.detach())
    summed = torch.stack(pieces).sum(0) if acc is None else acc
    return (diff * summed).sum(dim=-1)


def _ig_integrand(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    base: Tensor,
    target: Tensor,
    row: Tensor,
    alpha: Tensor,
    *,
    output: Optional[str],
    create_graph: bool,
    rows: int,
) -> Tensor:
    """``[P, T]``: Σ_E (e − e′)·∂F/∂e(e′ + α_p(e − e′)) of row ``row[p]`` at ``alpha[p]``, ``rows`` pairs per pass."""
    B = embeddings.shape[0]
    diff = embeddings - base
    pieces: List[Tensor] = []
    for start in range(0, row.numel(), rows):
        r = row[start : start + rows]
        d = diff.index_select(0, r)
        x = base.index_select(0, r) + alpha[start : start + rows].view(-1, 1, 1) * d
        if not create_graph:
            x = x.detach().requires_grad_(True)
        out = model.forward_from_embeddings(x, gather_rows(batch, r, B))
        score = target_score(out, target.index_select(0, r), output, head_kind_of(model))
        (grad,) = torch.autograd.grad(score.sum(), x, create_graph=create_graph)
        f = (d * grad).sum(-1)
        pieces.append(f if create_graph else f.detach())
    return torch.cat(pieces) if pieces else diff.new_zeros(0, diff.shape[1])


def _ig_gauss_kronrod(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    base: Tensor,
    target: Tensor,
    gap: Tensor,
    mask: Tensor,
    *,
    output: Optional[str],
    create_graph: bool,
    rows: int,
    rtol: float,
    atol: float,
    token_rtol: float,
    token_atol: float,
    max_steps: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-row globally adaptive G7/K15 on [0, 1]; returns ``(map [N, T], n_steps [N], converged [N] bool)``.

    Each row keeps its own list of intervals. A new interval [a, a+h] gets the 15 Kronrod nodes; per token,
    K15 is the interval's estimate and \\|K15 − G7\\| its error estimate. A row's map is the sum of its
    intervals' K15 and its per-token error estimate the sum of their error estimates. The row is done when
    every real token's error estimate is at most ``max(token_atol, token_rtol·Σ_t|IG_t|)`` and its
    completeness error is at most ``max(rtol·|F(x) − F(x′)|, atol)``; otherwise its intervals whose largest
    token error estimate is at least a quarter of the row's largest are halved (QUADPACK-QAG style, several
    per round so that rounds stay few and passes large), unless that would take the row past ``max_steps``
    gradient evaluations.
    """
    N, T, _ = embeddings.shape
    dev, dt = embeddings.device, embeddings.dtype
    nodes, kw, gw = (torch.as_tensor(v, dtype=dt, device=dev) for v in gauss_kronrod_nodes())
    K = len(nodes)
    steps = torch.zeros(N, dtype=torch.long, device=dev)
    converged = torch.zeros(N, dtype=torch.bool, device=dev)
    scores = torch.zeros(N, T, dtype=dt, device=dev)
    completeness_tol = torch.clamp(rtol * gap.abs(), min=atol)
    real = mask.to(dt)
    # intervals awaiting evaluation: [0, 1] for every row
    new_row = torch.arange(N, device=dev)
    new_left = torch.zeros(N, dtype=dt, device=dev)
    new_width = torch.ones(N, dtype=dt, device=dev)
    # evaluated intervals of the rows still refining
    row = new_row[:0]
    left, width = new_left[:0], new_width[:0]
    kron = embeddings.new_zeros(0, T)
    err = embeddings.new_zeros(0, T)
    while new_row.numel():
        M = new_row.numel()
        pair_row = new_row.repeat_interleave(K)
        pair_alpha = (new_left.view(M, 1) + new_width.view(M, 1) * nodes.view(1, K)).reshape(-1)
        f = _ig_integrand(
            model,
            batch,
            embeddings,
            base,
            target,
            pair_row,
            pair_alpha,
            output=output,
            create_graph=create_graph,
            rows=rows,
        ).view(M, K, T)
        k_new = torch.einsum("mkt,k->mt", f, kw) * new_width.view(M, 1)
        g_new = torch.einsum("mkt,k->mt", f.detach(), gw) * new_width.view(M, 1)
        steps.index_add_(0, new_row, torch.full_like(new_row, K))
        row, left, width = torch.cat([row, new_row]), torch.cat([left, new_left]), torch.cat([width, new_width])
        kron = torch.cat([kron, k_new])
        err = torch.cat([err, (k_new.detach() - g_new).abs() * real.index_select(0, new_row)])
        total = torch.zeros(N, T, dtype=dt, device=dev).index_add(0, row, kron)
        value = total.detach() * real
        token_err = torch.zeros(N, T, dtype=dt, device=dev).index_add_(0, row, err).amax(1)
        token_tol = torch.clamp(token_rtol * value.abs().sum(1), min=token_atol)
        present = torch.zeros(N, dtype=torch.bool, device=dev)
        present[row] = True
        complete = (value.sum(1) - gap).abs() <= completeness_tol
        ok = agree(present & (token_err <= token_tol) & complete)  # lockstep: process 0's decisions (sharding)
        interval_err = err.amax(1)
        row_max = torch.zeros(N, dtype=dt, device=dev).scatter_reduce(0, row, interval_err, "amax")
        split = agree((interval_err >= 0.25 * row_max.index_select(0, row)) & ~ok.index_select(0, row))
        extra = torch.zeros(N, dtype=torch.long, device=dev).index_add_(0, row, 2 * K * split.long())
        over = present & ~ok & (steps + extra > max_steps)
        split &= ~over.index_select(0, row)
        # a row with nothing left to halve (non-finite estimates) stops too, unconverged
        halving = torch.zeros(N, dtype=torch.long, device=dev).index_add_(0, row, split.long())
        finished = ok | over | (present & (halving == 0))
        converged |= ok
        scores = scores + total * finished.view(N, 1).to(dt)
        half = width[split] / 2
        new_row = torch.cat([row[split], row[split]])
        new_left = torch.cat([left[split], left[split] + half])
        new_width = torch.cat([half, half])
        keep = ~split & ~finished.index_select(0, row)
        row, left, width, kron, err = row[keep], left[keep], width[keep], kron[keep], err[keep]
    return scores * real, steps, converged

"""Integrated Gradients over input embeddings (Sundararajan et al., 2017): fixed rules and ``n_steps="auto"``.

``attribute(model, batch, "integrated_gradients", ...)`` runs :func:`integrated_gradients_map`; the quadrature
rules come from :mod:`lightning_xai.attribution.quadrature`, the rows per pass from
:func:`~lightning_xai.attribution.gradients.auto_internal_batch_size`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.adapters.sharding import agree
from lightning_xai.attribution.batching import gather_rows, pad_embeddings
from lightning_xai.attribution.gradients import _embed, _rows_per_pass
from lightning_xai.attribution.quadrature import IG_RULES, gauss_kronrod_nodes, ig_nodes
from lightning_xai.attribution.registry import SCORES_AND_DELTA, register_method
from lightning_xai.attribution.targets import resolve_target, target_score

__all__ = ["BASELINES", "IG_AUTO_TOKEN_RTOL", "integrated_gradients_map"]

BASELINES = ("zero", "pad")
#: ``n_steps="auto"``: each token's error estimate must stay within this share of the map's L1 mass. 3e-3 makes
#: the adaptive rule at least as accurate as Captum's 50 Gauss–Legendre steps at the 95th percentile and in
#: the worst case on the trained reference model (benchmarks/README.md, "Adaptive IG"); 1e-2 was 1.15× faster
#: with a 3.5× larger 95th-percentile error.
IG_AUTO_TOKEN_RTOL = 3e-3


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


def integrated_gradients_map(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    target: Any,
    *,
    create_graph: bool = False,
    n_steps: Union[int, str] = 50,
    baseline: Any = "zero",
    rule: str = "gauss_legendre",
    internal_batch_size: Union[int, str, None] = "auto",
    output: Optional[str] = None,
    rtol: float = 0.01,
    atol: float = 1e-6,
    max_steps: int = 256,
    start_steps: Optional[int] = None,
    token_rtol: float = IG_AUTO_TOKEN_RTOL,
    token_atol: float = 1e-7,
    pad_token_id: Optional[int] = None,
    warn_threshold: float = 0.05,
) -> Tuple[Tensor, Tensor, Tensor]:
    r"""IG over embeddings; returns ``(map [N, T], delta [N], n_steps [N])``. See :func:`attribute`.

    ``n_steps`` an int: the fixed ``rule`` with that many nodes for every row.

    ``n_steps="auto"`` (Gauss–Legendre rule, ``start_steps=None``): per-row globally adaptive Gauss–Kronrod
    (QUADPACK QAG style). Each row starts with the 15-node Kronrod rule on [0, 1], whose 7 odd nodes form the
    embedded 7-node Gauss rule; per token, K15 is the estimate and \|K15 − G7\| its error estimate (a
    conservative one: it measures the G7 error, and K15 is far more accurate once the integrand is resolved).
    A row's map is the sum of its intervals' K15 and each token's error estimate the sum of its intervals'.
    Stopping rule, per row: the row is done when every real token's summed error estimate is at most
    ``max(token_atol, token_rtol · Σ_t |IG_t|)`` (``token_rtol`` of the map's L1 mass) **and** its
    completeness error \|Σ_t IG_t − (F(x) − F(x′))\| is at most ``max(rtol · |F(x) − F(x′)|, atol)``.
    Otherwise its intervals whose largest token error estimate is at least a quarter of the row's largest
    are halved, each half getting its own 15 nodes; a row stops refining when that would exceed
    ``max_steps`` gradient evaluations (with a warning). Rows never wait for each other (a row's result and
    step count do not depend on the other rows of the batch), and ``n_steps`` returns the gradient
    evaluations each row used (15, 45, 75, ...).

    ``n_steps="auto"`` with ``start_steps`` given or a Riemann rule: the completeness-only doubling scheme —
    ``start_steps`` (default 6) nodes of ``rule``, then only the rows whose completeness error misses the
    tolerance are recomputed from scratch with twice the nodes, up to ``max_steps``; each row's result is the
    fixed-``rule`` result at its returned step count (token accuracy is not controlled).

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(30, 2, embedding_dim=8, hidden_dim=4).double().eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> emb = model.embed(batch).detach()
        >>> scores, delta, steps = integrated_gradients_map(model, batch, emb, None, n_steps="auto")
        >>> bool((delta.abs() <= 0.01 * scores.sum(1).abs() + 1e-6).all()), steps.tolist()
        (True, [15, 15])
    """
    if rule not in IG_RULES:
        raise ValueError(f"Unknown IG rule {rule!r}; choose one of {list(IG_RULES)}.")
    N, T, E = embeddings.shape
    rows = _rows_per_pass(internal_batch_size, T, E, embeddings.device)
    mask = model.token_mask(batch)
    base = _baseline(model, batch, embeddings, baseline, pad_token_id)
    with torch.no_grad():
        out_x = model.forward_from_embeddings(embeddings, batch)
        target = resolve_target(out_x, target)
        gap = target_score(out_x, target, output, head_kind_of(model)) - target_score(
            model.forward_from_embeddings(base, batch), target, output, head_kind_of(model)
        )

    def run(idx: Optional[Tensor], n: int) -> Tensor:
        alphas, weights = ig_nodes(n, rule)
        if idx is None:
            return _ig_path(
                model,
                batch,
                embeddings,
                base,
                target,
                alphas,
                weights,
                output=output,
                create_graph=create_graph,
                rows=rows,
            )
        return _ig_path(
            model,
            gather_rows(batch, idx, N),
            embeddings.index_select(0, idx),
            base.index_select(0, idx),
            target.index_select(0, idx),
            alphas,
            weights,
            output=output,
            create_graph=create_graph,
            rows=rows,
        )

    if n_steps == "auto" and start_steps is None and rule == "gauss_legendre":
        if not 0 < rtol < 1:
            raise ValueError(f"rtol must lie in (0, 1); got {rtol}.")
        if not 0 < token_rtol < 1 or not token_atol >= 0:
            raise ValueError(
                f"token_rtol must lie in (0, 1) and token_atol be >= 0; got token_rtol={token_rtol}, "
                f"token_atol={token_atol}."
            )
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 15:
            raise ValueError(f"max_steps must be an int >= 15 (one 15-node Kronrod rule); got {max_steps!r}.")
        scores, steps, converged = _ig_gauss_kronrod(
            model,
            batch,
            embeddings,
            base,
            target,
            gap,
            mask,
            output=output,
            create_graph=create_graph,
            rows=rows,
            rtol=rtol,
            atol=atol,
            token_rtol=token_rtol,
            token_atol=token_atol,
            max_steps=max_steps,
        )
        missed = int((~converged).sum())
        if missed:
            warnings.warn(
                f"n_steps='auto': {missed} of {N} rows missed the token tolerance (token_rtol={token_rtol}) "
                f"or the completeness tolerance (rtol={rtol}) at max_steps={max_steps}; raise max_steps.",
                RuntimeWarning,
                stacklevel=4,
            )
    elif n_steps == "auto":
        if not 0 < rtol < 1:
            raise ValueError(f"rtol must lie in (0, 1); got {rtol}.")
        n = 6 if start_steps is None else int(start_steps)
        if n < (1 if rule == "gauss_legendre" else 2) or max_steps < n:
            raise ValueError(
                f"need 1 <= start_steps <= max_steps; got start_steps={start_steps}, max_steps={max_steps}."
            )
        scores = torch.zeros(N, T, dtype=embeddings.dtype, device=embeddings.device)
        steps = torch.zeros(N, dtype=torch.long, device=embeddings.device)
        active = torch.arange(N, device=embeddings.device)
        tolerance = torch.clamp(rtol * gap.abs(), min=atol)
        while active.numel():
            part = run(None if active.numel() == N else active, n).masked_fill(~mask.index_select(0, active), 0.0)
            delta = part.detach().sum(1) - gap.index_select(0, active)
            done = agree((delta.abs() <= tolerance.index_select(0, active)) | (n >= max_steps))
            finished = active[done]
            scores = scores.index_copy(0, finished, part[done])
            steps[finished] = n
            active = active[~done]
            n = min(2 * n, max_steps)
        unconverged = int(((scores.detach().sum(1) - gap).abs() > tolerance).sum())
        if unconverged:
            warnings.warn(
                f"n_steps='auto': {unconverged} of {N} rows missed the completeness tolerance "
                f"(rtol={rtol}) at max_steps={max_steps}; raise max_steps.",
                RuntimeWarning,
                stacklevel=4,
            )
    else:
        if isinstance(n_steps, str):  # not "auto": ig_nodes' own error, raised before run() would get it
            raise ValueError(f"n_steps must be a positive int (or 'auto'); got {n_steps!r}.")
        scores = run(None, n_steps).masked_fill(~mask, 0.0)
        steps = torch.full((N,), int(n_steps), dtype=torch.long, device=embeddings.device)
    delta = scores.detach().sum(1) - gap
    floor = math.sqrt(torch.finfo(embeddings.dtype).eps)
    bad = (delta.abs() > warn_threshold * gap.abs()) & (delta.abs() > floor)
    if bool(bad.any()):
        warnings.warn(
            f"Integrated gradients: convergence delta exceeds {warn_threshold:.0%} of |F(x) - F(x')| "
            f"for {int(bad.sum())} of {N} rows ({_worst_delta(delta, gap, bad, floor)}); raise n_steps "
            "or use n_steps='auto'" + _precision_hint(embeddings, scores) + ".",
            RuntimeWarning,
            stacklevel=4,
        )
    return scores, delta, steps


def _worst_delta(delta: Tensor, gap: Tensor, bad: Tensor, floor: float) -> str:
    """The warned row with the largest |delta|, absolute and relative to |F(x) − F(x′)| — the relative
    error only where that gap exceeds ``floor`` (a gap of ~0 makes any ratio meaningless)."""
    worst = int(torch.where(bad, delta.abs(), torch.full_like(delta, -1.0)).argmax())
    d, g = abs(float(delta[worst])), abs(float(gap[worst]))
    relative = (
        f"{d / g:.1%} of |F(x) - F(x')| = {g:.3g}"
        if g > floor
        else f"|F(x) - F(x')| = {g:.3g} is below {floor:.2g}, so no relative error"
    )
    return f"worst |delta| = {d:.3g}, {relative}"


def _precision_hint(embeddings: Tensor, scores: Tensor) -> str:
    reduced = {t.dtype for t in (embeddings, scores)} & {torch.float16, torch.bfloat16} or (
        {torch.get_autocast_dtype(embeddings.device.type)}
        if torch.is_autocast_enabled(embeddings.device.type)
        else set()
    )
    if not reduced:
        return ""
    return (
        f", and compute it in float32: the model runs in {', '.join(sorted(map(str, reduced)))} (the audit "
        "callbacks do this by default, precision='auto')"
    )


@register_method("integrated_gradients", resolves_target=True, precision_sensitive=True, returns=SCORES_AND_DELTA)
def _integrated_gradients(
    model: ExplainableModel,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    n_steps: Union[int, str] = 50,
    baseline: Any = "zero",
    rule: str = "gauss_legendre",
    internal_batch_size: Union[int, str, None] = "auto",
    return_convergence_delta: bool = False,
    return_n_steps: bool = False,
    output: Optional[str] = None,
    rtol: float = 0.01,
    atol: float = 1e-6,
    max_steps: int = 256,
    start_steps: Optional[int] = None,
    token_rtol: float = IG_AUTO_TOKEN_RTOL,
    token_atol: float = 1e-7,
    pad_token_id: Optional[int] = None,
    warn_threshold: float = 0.05,
) -> Union[Tensor, Tuple[Tensor, ...]]:
    if not (n_steps == "auto" or isinstance(n_steps, (int, np.integer))) or isinstance(n_steps, bool):
        raise ValueError(f"n_steps must be a positive int or 'auto'; got {n_steps!r}.")
    scores, delta, steps = integrated_gradients_map(
        model,
        batch,
        _embed(model, batch, create_graph),
        target,
        create_graph=create_graph,
        n_steps=n_steps,
        baseline=baseline,
        rule=rule,
        internal_batch_size=internal_batch_size,
        output=output,
        rtol=rtol,
        atol=atol,
        max_steps=max_steps,
        start_steps=start_steps,
        token_rtol=token_rtol,
        token_atol=token_atol,
        pad_token_id=pad_token_id,
        warn_threshold=warn_threshold,
    )
    extras: Sequence[Tensor] = ([delta] if return_convergence_delta else []) + ([steps] if return_n_steps else [])
    return (scores, *extras) if extras else scores

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
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution.batching import pad_embeddings, take_rows
from lightning_xai.attribution.core import register_method, resolve_target, target_score

__all__ = ["IG_AUTO_TOKEN_RTOL", "IG_RULES", "GRADIENT_METHODS", "auto_internal_batch_size", "shared_input_gradients", "ig_nodes", "gauss_kronrod_nodes",
           "attention_map", "gradient_map", "grad_x_input_map", "integrated_gradients_map", "smooth_grad_map"]

IG_RULES = ("gauss_legendre", "riemann_left", "riemann_middle", "riemann_right", "riemann_trapezoid")
BASELINES = ("zero", "pad")
#: ``n_steps="auto"``: each token's error estimate must stay within this share of the map's L1 mass. 3e-3 makes
#: the adaptive rule at least as accurate as Captum's 50 Gauss–Legendre steps at the 95th percentile and in
#: the worst case on the trained reference model (benchmarks/README.md, "Adaptive IG"); 1e-2 was 1.15× faster
#: with a 3.5× larger 95th-percentile error.
IG_AUTO_TOKEN_RTOL = 3e-3
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


# Gauss–Kronrod G7/K15 on [-1, 1] (QUADPACK qk15; Piessens et al. 1983, also scipy.integrate.quad_vec): the 15
# Kronrod nodes contain the 7 Gauss nodes (odd positions), K15 is exact to degree 22, G7 to degree 13.
_GK15_NODES = np.array([-0.991455371120812639206854697526329, -0.949107912342758524526189684047851,
                        -0.864864423359769072789712788640926, -0.741531185599394439863864773280788,
                        -0.586087235467691130294144838258730, -0.405845151377397166906606412076961,
                        -0.207784955007898467600689403773245, 0.0, 0.207784955007898467600689403773245,
                        0.405845151377397166906606412076961, 0.586087235467691130294144838258730,
                        0.741531185599394439863864773280788, 0.864864423359769072789712788640926,
                        0.949107912342758524526189684047851, 0.991455371120812639206854697526329])
_K15_WEIGHTS = np.array([0.022935322010529224963732008058970, 0.063092092629978553290700663189204,
                         0.104790010322250183839876322541518, 0.140653259715525918745189590510238,
                         0.169004726639267902826583426598550, 0.190350578064785409913256402421014,
                         0.204432940075298892414161999234649, 0.209482141084727828012999174891714,
                         0.204432940075298892414161999234649, 0.190350578064785409913256402421014,
                         0.169004726639267902826583426598550, 0.140653259715525918745189590510238,
                         0.104790010322250183839876322541518, 0.063092092629978553290700663189204,
                         0.022935322010529224963732008058970])
_G7_WEIGHTS = np.array([0.129484966168869693270611432679082, 0.279705391489276667901467771423780,
                        0.381830050505118944950369775488975, 0.417959183673469387755102040816327,
                        0.381830050505118944950369775488975, 0.279705391489276667901467771423780,
                        0.129484966168869693270611432679082])


def gauss_kronrod_nodes() -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(alphas [15], kronrod_weights [15], gauss_weights [15])`` of the G7/K15 pair on [0, 1], in float64.

    The Gauss weights are 0 at the 8 Kronrod-only nodes, so one set of 15 gradient evaluations gives both the
    15-point Kronrod estimate (exact for polynomials up to degree 22) and the embedded 7-point Gauss estimate
    (degree 13); their difference estimates the quadrature error.

    Example:
        >>> a, k, g = gauss_kronrod_nodes()
        >>> round(float(k.sum()), 12), round(float(g.sum()), 12), int((g > 0).sum())
        (1.0, 1.0, 7)
    """
    gauss = np.zeros(15)
    gauss[1::2] = _G7_WEIGHTS
    return 0.5 * (_GK15_NODES + 1.0), 0.5 * _K15_WEIGHTS, 0.5 * gauss


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

    Inside the context the last input gradient is kept; a later call whose model, embeddings, token mask,
    target, ``output`` and ``detach_attention`` are equal reuses it instead of recomputing it — the two maps of
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
        return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and a.dtype == b.dtype
                and a.device == b.device and bool(torch.equal(a, b)))
    return a == b


def _input_gradients(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *, output: str,
                     create_graph: bool, detach_attention: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """``(grad [N, T, E], inputs the grad is w.r.t., resolved target)`` of the target score.

    With ``detach_attention`` the attention distribution is computed first and fed back as a constant
    ``attention_override`` (Jain & Wallace's gradient), so no gradient flows through the attention scorer.
    """
    sharing = _shared is not None and not create_graph
    if sharing and _shared:
        key, cached = _shared
        if (key[0] is model and key[1:3] == (output, detach_attention) and _same(key[3], target)
                and _same(key[4], embeddings) and _same(key[5], model.token_mask(batch))):
            return cached
    result = _compute_input_gradients(model, batch, embeddings, target, output=output, create_graph=create_graph,
                                      detach_attention=detach_attention)
    if sharing:
        _shared[:] = [(model, output, detach_attention, target, embeddings.detach(), model.token_mask(batch)), result]
    return result


def _compute_input_gradients(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *,
                             output: str, create_graph: bool,
                             detach_attention: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    if create_graph and embeddings.requires_grad:
        inputs = embeddings
    else:
        inputs = embeddings.detach().requires_grad_(True)
    override = None
    if detach_attention:
        with torch.no_grad():
            override = model.forward_from_embeddings(inputs.detach(), batch).attention.detach()
    logits = model.forward_from_embeddings(inputs, batch, attention_override=override).logits
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
                 create_graph: bool = False, reduction: str = "l2", output: str = "probability",
                 detach_attention: bool = False) -> Tensor:
    """‖∂ score/∂e_t‖₂ (``"l2"``) or Σ_E \\|∂ score/∂e_t\\| (``"abs_sum"``) for each token."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"Unknown reduction {reduction!r} for 'gradient'; choose one of {list(REDUCTIONS)}.")
    grad, _, _ = _input_gradients(model, batch, embeddings, target, output=output, create_graph=create_graph,
                                  detach_attention=detach_attention)
    return _safe_l2(grad) if reduction == "l2" else grad.abs().sum(dim=-1)


def grad_x_input_map(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *,
                     create_graph: bool = False, output: str = "probability", absolute: bool = False,
                     detach_attention: bool = False) -> Tensor:
    """Σ_E (∂ score/∂e_t)·e_t (Jain & Wallace: ``output="probability"``, ``absolute=True``, ``detach_attention=True``)."""
    grad, inputs, _ = _input_gradients(model, batch, embeddings, target, output=output, create_graph=create_graph,
                                       detach_attention=detach_attention)
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


def _ig_integrand(model: ExplainableModel, batch: Batch, embeddings: Tensor, base: Tensor, target: Tensor,
                  row: Tensor, alpha: Tensor, *, output: str, create_graph: bool, rows: int) -> Tensor:
    """``[P, T]``: Σ_E (e − e′)·∂F/∂e(e′ + α_p(e − e′)) of row ``row[p]`` at ``alpha[p]``, ``rows`` pairs per pass."""
    B = embeddings.shape[0]
    diff = embeddings - base
    pieces: List[Tensor] = []
    for start in range(0, row.numel(), rows):
        r = row[start:start + rows]
        d = diff.index_select(0, r)
        x = base.index_select(0, r) + alpha[start:start + rows].view(-1, 1, 1) * d
        if not create_graph:
            x = x.detach().requires_grad_(True)
        logits = model.forward_from_embeddings(x, take_rows(batch, r, B)).logits
        score = target_score(logits, target.index_select(0, r), output)
        (grad,) = torch.autograd.grad(score.sum(), x, create_graph=create_graph)
        f = (d * grad).sum(-1)
        pieces.append(f if create_graph else f.detach())
    return torch.cat(pieces) if pieces else diff.new_zeros(0, diff.shape[1])


def _ig_gauss_kronrod(model: ExplainableModel, batch: Batch, embeddings: Tensor, base: Tensor, target: Tensor,
                      gap: Tensor, mask: Tensor, *, output: str, create_graph: bool, rows: int, rtol: float,
                      atol: float, token_rtol: float, token_atol: float,
                      max_steps: int) -> Tuple[Tensor, Tensor, Tensor]:
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
        f = _ig_integrand(model, batch, embeddings, base, target, pair_row, pair_alpha, output=output,
                          create_graph=create_graph, rows=rows).view(M, K, T)
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
        ok = present & (token_err <= token_tol) & complete
        interval_err = err.amax(1)
        row_max = torch.zeros(N, dtype=dt, device=dev).scatter_reduce(0, row, interval_err, "amax")
        split = (interval_err >= 0.25 * row_max.index_select(0, row)) & ~ok.index_select(0, row)
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


def integrated_gradients_map(model: ExplainableModel, batch: Batch, embeddings: Tensor, target: Any, *,
                             create_graph: bool = False, n_steps: Union[int, str] = 50, baseline: Any = "zero",
                             rule: str = "gauss_legendre", internal_batch_size: Union[int, str, None] = "auto",
                             output: str = "probability", rtol: float = 0.01, atol: float = 1e-6,
                             max_steps: int = 256, start_steps: Optional[int] = None,
                             token_rtol: float = IG_AUTO_TOKEN_RTOL, token_atol: float = 1e-7, pad_token_id: Optional[int] = None,
                             warn_threshold: float = 0.05) -> Tuple[Tensor, Tensor, Tensor]:
    """IG over embeddings; returns ``(map [N, T], delta [N], n_steps [N])``. See :func:`attribute`.

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

    if n_steps == "auto" and start_steps is None and rule == "gauss_legendre":
        if not 0 < rtol < 1:
            raise ValueError(f"rtol must lie in (0, 1); got {rtol}.")
        if not 0 < token_rtol < 1 or not token_atol >= 0:
            raise ValueError(f"token_rtol must lie in (0, 1) and token_atol be >= 0; got token_rtol={token_rtol}, "
                             f"token_atol={token_atol}.")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 15:
            raise ValueError(f"max_steps must be an int >= 15 (one 15-node Kronrod rule); got {max_steps!r}.")
        scores, steps, converged = _ig_gauss_kronrod(
            model, batch, embeddings, base, target, gap, mask, output=output, create_graph=create_graph, rows=rows,
            rtol=rtol, atol=atol, token_rtol=token_rtol, token_atol=token_atol, max_steps=max_steps)
        missed = int((~converged).sum())
        if missed:
            warnings.warn(f"n_steps='auto': {missed} of {N} rows missed the token tolerance (token_rtol={token_rtol}) "
                          f"or the completeness tolerance (rtol={rtol}) at max_steps={max_steps}; raise max_steps.",
                          RuntimeWarning, stacklevel=4)
    elif n_steps == "auto":
        if not 0 < rtol < 1:
            raise ValueError(f"rtol must lie in (0, 1); got {rtol}.")
        n = 6 if start_steps is None else int(start_steps)
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
              reduction: str = "l2", output: str = "probability", detach_attention: bool = False) -> Tensor:
    return gradient_map(model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph,
                        reduction=reduction, output=output, detach_attention=detach_attention)


@register_method("grad_x_input", resolves_target=True)
def _grad_x_input(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False,
                  output: str = "probability", absolute: bool = False, detach_attention: bool = False) -> Tensor:
    return grad_x_input_map(model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph,
                            output=output, absolute=absolute, detach_attention=detach_attention)


@register_method("integrated_gradients", resolves_target=True)
def _integrated_gradients(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False,
                          n_steps: Union[int, str] = 50, baseline: Any = "zero", rule: str = "gauss_legendre",
                          internal_batch_size: Union[int, str, None] = "auto",
                          return_convergence_delta: bool = False, return_n_steps: bool = False,
                          output: str = "probability", rtol: float = 0.01, atol: float = 1e-6,
                          max_steps: int = 256, start_steps: Optional[int] = None, token_rtol: float = IG_AUTO_TOKEN_RTOL,
                          token_atol: float = 1e-7, pad_token_id: Optional[int] = None,
                          warn_threshold: float = 0.05) -> Union[Tensor, Tuple[Tensor, ...]]:
    if not (n_steps == "auto" or isinstance(n_steps, (int, np.integer))) or isinstance(n_steps, bool):
        raise ValueError(f"n_steps must be a positive int or 'auto'; got {n_steps!r}.")
    scores, delta, steps = integrated_gradients_map(
        model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph, n_steps=n_steps,
        baseline=baseline, rule=rule, internal_batch_size=internal_batch_size, output=output, rtol=rtol, atol=atol,
        max_steps=max_steps, start_steps=start_steps, token_rtol=token_rtol, token_atol=token_atol,
        pad_token_id=pad_token_id, warn_threshold=warn_threshold)
    extras: Sequence[Tensor] = ([delta] if return_convergence_delta else []) + ([steps] if return_n_steps else [])
    return (scores, *extras) if extras else scores


@register_method("smooth_grad", resolves_target=True)
def _smooth_grad(model: ExplainableModel, batch: Batch, target: Any, *, create_graph: bool = False,
                 **options: Any) -> Tensor:
    return smooth_grad_map(model, batch, _embed(model, batch, create_graph), target, create_graph=create_graph,
                           **options)

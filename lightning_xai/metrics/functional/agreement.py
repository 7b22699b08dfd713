"""Agreement between two token score maps, per instance over its real tokens, vectorised over the batch.

Every function takes score maps ``preds``/``target`` ``[B, T]`` and a bool ``mask`` ``[B, T]`` (True at real
tokens) and returns one value per instance. Values at pad positions are ignored, whatever they hold.

Conventions shared by the correlations (they follow scipy, which the tests use as the oracle):

* An instance where either map is constant over its real tokens (this includes a single real token) has no
  defined correlation: τ, ρ, r and their p-values are ``NaN`` there, exactly as scipy returns. The Metric classes
  in :mod:`lightning_xai.metrics` skip such instances and report their share as ``undefined_fraction``.
  Uniform attention (every weight 1/L) is the common case in practice.
* Two real tokens give τ = ρ = r = ±1 with p = 1 (Kendall, Pearson) and p = NaN (Spearman), as scipy.
* A row with no real token, NaN/inf at a real token, or mismatched shapes raise ``ValueError``.

Unlike ``torchmetrics.functional.kendall_rank_corrcoef`` / ``spearman_corrcoef`` / ``pearson_corrcoef``, which
correlate *across samples* (one value per output column), these correlate *within* each instance over its
tokens, as Jain & Wallace (2019) do.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.metrics.functional._special import (KENDALL_EXACT_MAX_N, kendall_exact_table,
                                                         two_sided_t_pvalue)
from lightning_xai.metrics.functional._validation import check_maps, resolve_k, topk_mask

__all__ = ["jensen_shannon", "jw_top_k", "kendall_tau", "pearson", "spearman", "topk_kendall_tau", "topk_overlap"]

# pairwise signs are computed on [chunk, T, T] blocks of at most this many elements
_PAIR_BUDGET = 1 << 15  # below torch's intra-op grain size (32768): no thread pool per op; cache-sized blocks


def _pair_stats(x: Tensor, y: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Per row: C − D (concordant minus discordant pairs) and per-token tie-group sizes of x and y.

    Pairwise signs ``sign(x_i − x_j)`` over ``[chunk, T, T]`` blocks (arithmetic, no per-instance loop); pairs
    involving a pad are weighted out with the mask.
    """
    B, T = x.shape
    pairs = max(1, T * T)
    # small blocks stay in cache; long documents get blocks of up to 2^24 pairs (one row only beyond 4096 tokens)
    rows = _PAIR_BUDGET // pairs if pairs * 8 <= _PAIR_BUDGET else max(1, (1 << 24) // pairs)
    xs, ys = x.masked_fill(~mask, 0.0), y.masked_fill(~mask, 0.0)
    weight = mask.to(xs.dtype).unsqueeze(1)  # [B, 1, T]: zeroes the pairs (i, j) with j a pad
    per_token, diff_x, diff_y = [], [], []
    for start in range(0, B, rows):  # blocks of many instances each, not one per instance
        xb, yb, wb = xs[start:start + rows], ys[start:start + rows], weight[start:start + rows]
        sx = (xb.unsqueeze(2) - xb.unsqueeze(1)).sign_().mul_(wb)  # exact: x_i − x_j is 0 iff x_i == x_j
        sy = (yb.unsqueeze(2) - yb.unsqueeze(1)).sign_().mul_(wb)
        per_token.append((sx * sy).sum(2))  # plain reductions, not BLAS: predictable on a busy machine
        diff_x.append(sx.abs_().sum(2))  # #{real j : x_j != x_i}
        diff_y.append(sy.abs_().sum(2))
    real = mask.double()
    n = real.sum(1, keepdim=True)
    cmd = (torch.cat(per_token).double() * real).sum(1) / 2  # ordered pairs count each pair twice
    # tie-group size of token i (itself included) = n − #{real j : x_j != x_i}
    tx, ty = n - torch.cat(diff_x).double(), n - torch.cat(diff_y).double()
    # sums of ±1/0 values: exact integers in floating point (no rounding needed)
    return cmd, tx, ty


def _tie_stats(t: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """From per-token tie-group sizes: Σt(t−1)/2, Σt(t−1)(t−2), Σt(t−1)(2t+5) over groups, and #distinct values."""
    t = t.masked_fill(~mask, 1.0)
    real = mask.double()
    ties = ((t - 1) * real).sum(1) / 2
    t0 = ((t - 1) * (t - 2) * real).sum(1)
    t1 = ((t - 1) * (2 * t + 5) * real).sum(1)
    distinct = torch.floor((real / t).sum(1) + 0.5)
    return ties, t0, t1, distinct


def kendall_tau(preds: Tensor, target: Tensor, mask: Tensor, variant: str = "b") -> Tuple[Tensor, Tensor]:
    r"""Kendall's τ between two score maps per instance over real tokens, with scipy's p-value.

    Equal to ``scipy.stats.kendalltau(preds[b][mask[b]], target[b][mask[b]], variant=variant)`` for every ``b``
    (defaults ``method="auto"``, two-sided): τ-b = (C − D) / √((n₀ − n₁)(n₀ − n₂)) with n₀ = n(n−1)/2 and
    n₁, n₂ the tied pairs of each map. The p-value is exact (Kendall's null distribution) when there are no ties
    and n ≤ 33 or min(C, D) ≤ 1, else the normal approximation with the tie-corrected variance — scipy's rule.
    Constant maps (and n = 1) give NaN, as in scipy. All instances are computed together from ``[B, T, T]``
    pair comparisons (chunked to bound memory), never with a loop over instances.

    Args:
        preds: ``[B, T]`` first score map (e.g. attention).
        target: ``[B, T]`` second score map (e.g. a saliency map).
        mask: ``[B, T]`` bool, True at real tokens.
        variant: ``"b"`` (τ-b, Jain & Wallace's choice) or ``"c"`` (Stuart's τ-c).

    Returns:
        ``(tau, p_value)``, each ``[B]`` float64.

    Example:
        >>> import torch
        >>> a = torch.tensor([[0.1, 0.5, 0.3, 0.0], [1.0, 2.0, 3.0, 4.0]])
        >>> b = torch.tensor([[0.2, 0.9, 0.1, 7.0], [4.0, 3.0, 2.0, 1.0]])
        >>> mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
        >>> tau, p = kendall_tau(a, b, mask)
        >>> tau, p
        (tensor([ 0.3333, -1.0000], dtype=torch.float64), tensor([1.0000, 0.0833], dtype=torch.float64))
    """
    if variant not in ("b", "c"):
        raise ValueError(f"Unknown Kendall variant {variant!r}; use 'b' (tau-b) or 'c' (tau-c).")
    check_maps(preds, target, mask=mask)
    n = mask.sum(1)
    cmd, tx, ty = _pair_stats(preds, target, mask)
    xtie, x0, x1, xdistinct = _tie_stats(tx, mask)
    ytie, y0, y1, ydistinct = _tie_stats(ty, mask)
    tot = (n * (n - 1) // 2).double()
    undefined = (xtie == tot) | (ytie == tot)  # constant map, or n = 1 (tot = 0)
    nd = n.double()
    if variant == "b":
        denom = torch.sqrt(tot - xtie) * torch.sqrt(tot - ytie)
        tau = cmd / torch.where(undefined, torch.ones_like(denom), denom)
    else:
        classes = torch.minimum(xdistinct, ydistinct).double()
        scale = nd ** 2 * (classes - 1) / classes
        tau = 2 * cmd / torch.where(undefined, torch.ones_like(scale), scale)
    tau = tau.clamp(-1.0, 1.0)

    # p-values: scipy's method="auto"
    no_ties = (xtie == 0) & (ytie == 0)
    dis = (tot - cmd) / 2  # without ties every pair is concordant or discordant (only used then)
    c = torch.minimum(dis, tot - dis).long()
    exact = no_ties & ((n <= KENDALL_EXACT_MAX_N) | (c <= 1))
    table = kendall_exact_table(preds.device)
    p = table[n.clamp(max=KENDALL_EXACT_MAX_N), c.clamp(min=0, max=table.shape[1] - 1)]
    if bool((exact & (n > KENDALL_EXACT_MAX_N)).any()):
        # n > 33 with min(C, D) <= 1: Kendall's closed forms 2/n! (c = 0) and 2/(n−1)! (c = 1)
        log_fact = torch.where(c == 0, torch.lgamma(nd + 1), torch.lgamma(nd))
        p_closed = torch.exp(math.log(2.0) - log_fact).clamp(max=1.0)
        p = torch.where(n <= KENDALL_EXACT_MAX_N, p, p_closed)
    if not bool(exact.all()):
        # normal approximation with scipy's tie-corrected variance of C − D
        m = nd * (nd - 1)
        safe_m = torch.where(m > 0, m, torch.ones_like(m))
        safe_m2 = torch.where(nd > 2, safe_m * (nd - 2), torch.ones_like(m))
        var = (m * (2 * nd + 5) - x1 - y1) / 18 + 2 * xtie * ytie / safe_m + x0 * y0 / (9 * safe_m2)
        z = cmd / torch.sqrt(torch.where(var > 0, var, torch.ones_like(var)))
        p_asym = torch.special.erfc(z.abs() / math.sqrt(2.0)).clamp(max=1.0)
        p = torch.where(exact, p, p_asym)
    nan = torch.full_like(tau, float("nan"))
    return torch.where(undefined, nan, tau), torch.where(undefined, nan, p)


def jw_top_k(mask: Tensor) -> int:
    """Jain & Wallace's default top-k size for a batch: ``max(10, floor(0.1 · mean real length))``.

    Example:
        >>> import torch
        >>> jw_top_k(torch.ones(2, 150, dtype=torch.bool))
        15
    """
    return max(10, int(0.1 * float(mask.sum(1).double().mean())))


def topk_kendall_tau(preds: Tensor, target: Tensor, mask: Tensor, k: Optional[Union[int, float]] = None,
                     variant: str = "b") -> Tuple[Tensor, Tensor]:
    r"""Kendall's τ restricted to the tokens either map ranks in its top k.

    Our reading of Jain & Wallace's τ_top-k: for each instance take the union U of the ``k`` highest-scoring real
    tokens of ``preds`` and of ``target`` and compute :func:`kendall_tau` (scipy τ-b and p-value) over U.
    ``k`` defaults to J&W's ``max(10, floor(0.1 · mean length))`` with the mean taken over this batch's real
    lengths (:func:`jw_top_k`); an int ``k`` is capped at each instance's length (so short sentences use all their
    tokens), a float in (0, 1] is a fraction of each instance's length. Ties at the k-th score are broken by
    position. J&W's repository also carries Checco's Fagin et al. (2003) top-k *distance*
    (``common_code/kendall_top_k.py``), a number in [0, 1] rather than a τ; it is not what this computes.

    Example:
        >>> import torch
        >>> a = torch.arange(12.).unsqueeze(0)
        >>> tau, p = topk_kendall_tau(a, a.flip(1) * 0 + a, torch.ones(1, 12, dtype=torch.bool), k=3)
        >>> float(tau[0])
        1.0
    """
    check_maps(preds, target, mask=mask)
    k = jw_top_k(mask) if k is None else k
    sizes = resolve_k(k, mask.sum(1))
    union = topk_mask(preds, mask, sizes) | topk_mask(target, mask, sizes)
    return kendall_tau(preds, target, union, variant=variant)


def _average_ranks(values: Tensor, mask: Tensor) -> Tensor:
    """1-based ranks over real tokens with ties given their average rank (scipy ``rankdata(method="average")``)."""
    B, T = values.shape
    filled = values.masked_fill(~mask, float("nan"))
    ordered, order = torch.sort(filled, dim=1, stable=True)
    starts = torch.ones(B, T, dtype=torch.bool, device=values.device)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = torch.cumsum(starts.long(), dim=1) - 1
    sizes = torch.zeros(B, T, dtype=torch.long, device=values.device).scatter_add_(1, group, torch.ones_like(group))
    positions = torch.arange(T, device=values.device).expand(B, T)
    first = torch.full((B, T), T, dtype=torch.long, device=values.device).scatter_reduce_(
        1, group, positions.contiguous(), reduce="amin")
    rank_sorted = first.gather(1, group).double() + (sizes.gather(1, group).double() + 1) / 2
    ranks = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    return ranks.masked_fill(~mask, 0.0)


def _masked_pearson(x: Tensor, y: Tensor, mask: Tensor) -> Tensor:
    x, y = x.double().masked_fill(~mask, 0.0), y.double().masked_fill(~mask, 0.0)
    n = mask.sum(1, keepdim=True).double()
    xc = (x - x.sum(1, keepdim=True) / n).masked_fill(~mask, 0.0)
    yc = (y - y.sum(1, keepdim=True) / n).masked_fill(~mask, 0.0)
    # scale first (as scipy does) so tiny or huge maps do not under/overflow
    xc = xc / xc.abs().amax(1, keepdim=True).clamp_min(1e-300)
    yc = yc / yc.abs().amax(1, keepdim=True).clamp_min(1e-300)
    r = (xc * yc).sum(1) / (torch.linalg.vector_norm(xc, dim=1) * torch.linalg.vector_norm(yc, dim=1))
    return r.clamp(-1.0, 1.0)


def _constant(values: Tensor, mask: Tensor) -> Tensor:
    filled_hi = values.masked_fill(~mask, float("-inf")).amax(1)
    filled_lo = values.masked_fill(~mask, float("inf")).amin(1)
    return filled_hi == filled_lo


def pearson(preds: Tensor, target: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Pearson's r per instance over real tokens with scipy's two-sided p-value ``I_{1−r²}((n−2)/2, ½)``.

    Equal to ``scipy.stats.pearsonr`` per instance; constant maps (and n = 1) give NaN; n = 2 gives p = 1.

    Example:
        >>> import torch
        >>> r, p = pearson(torch.tensor([[1., 2., 3., 5.]]), torch.tensor([[2., 4., 5., 4.]]),
        ...                torch.ones(1, 4, dtype=torch.bool))
        >>> round(float(r[0]), 4), round(float(p[0]), 4)
        (0.5817, 0.4183)
    """
    check_maps(preds, target, mask=mask)
    n = mask.sum(1)
    undefined = _constant(preds, mask) | _constant(target, mask)
    r = _masked_pearson(preds, target, mask)
    p = torch.where(n > 2, two_sided_t_pvalue(r, n), torch.ones_like(r))
    nan = torch.full_like(r, float("nan"))
    return torch.where(undefined, nan, r), torch.where(undefined, nan, p)


def spearman(preds: Tensor, target: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    r"""Spearman's ρ (Pearson of average ranks) per instance over real tokens, with scipy's t-test p-value.

    Equal to ``scipy.stats.spearmanr`` per instance; constant maps (and n = 1) give NaN; n = 2 gives ρ = ±1
    and p = NaN, as scipy.

    Example:
        >>> import torch
        >>> rho, p = spearman(torch.tensor([[1., 2., 3., 5.]]), torch.tensor([[2., 4., 5., 4.]]),
        ...                   torch.ones(1, 4, dtype=torch.bool))
        >>> round(float(rho[0]), 4), round(float(p[0]), 4)
        (0.6325, 0.3675)
    """
    check_maps(preds, target, mask=mask)
    n = mask.sum(1)
    undefined = _constant(preds, mask) | _constant(target, mask)
    rho = _masked_pearson(_average_ranks(preds, mask), _average_ranks(target, mask), mask)
    p = torch.where(n > 2, two_sided_t_pvalue(rho, n), torch.full_like(rho, float("nan")))
    nan = torch.full_like(rho, float("nan"))
    return torch.where(undefined, nan, rho), torch.where(undefined, nan, p)


def _normalise(scores: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    mass = scores.double().abs().masked_fill(~mask, 0.0)
    total = mass.sum(1, keepdim=True)
    zero = (total == 0).squeeze(1)
    return mass / torch.where(total > 0, total, torch.ones_like(total)), zero


def jensen_shannon(preds: Tensor, target: Tensor, mask: Tensor, eps: float = 1e-10) -> Tensor:
    r"""Jensen–Shannon divergence (natural log) between the two maps seen as distributions over real tokens.

    Each map is made non-negative with ``|·|`` and normalised to sum to 1 over the real tokens, then
    JSD(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q)/2, following Jain & Wallace's code:
    KL(p ‖ m) = Σ p (log(p + ε) − log(m + ε)) with ε = 1e-10. Symmetric, in [0, ln 2]. With ``eps=0`` the exact
    divergence is computed (equal to ``scipy.spatial.distance.jensenshannon(p, q) ** 2``); the ε version differs
    from it by less than 1e-8. ``torchmetrics.functional.kl_divergence`` is not used: it renormalises its
    inputs and has no mask, so the zero-mass pads of a ``[B, T]`` batch would need a per-instance loop.
    A map that is zero at every real token has no distribution: its JSD is NaN (skipped by the Metric class).

    Example:
        >>> import torch
        >>> jsd = jensen_shannon(torch.tensor([[1., 0.]]), torch.tensor([[0., 1.]]), torch.ones(1, 2, dtype=torch.bool))
        >>> round(float(jsd[0]), 6) == round(math.log(2), 6)
        True
    """
    check_maps(preds, target, mask=mask)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}.")
    p, p_zero = _normalise(preds, mask)
    q, q_zero = _normalise(target, mask)
    m = 0.5 * (p + q)
    if eps == 0.0:
        # p·log(p/m) with 0·log 0 = 0 (m = 0 only where p = q = 0, e.g. at pads)
        kl_p = (torch.special.xlogy(p, p) - torch.special.xlogy(p, m)).sum(1)
        kl_q = (torch.special.xlogy(q, q) - torch.special.xlogy(q, m)).sum(1)
        jsd = 0.5 * (kl_p + kl_q)
    else:
        log_m = torch.log(m + eps)
        jsd = 0.5 * ((p * (torch.log(p + eps) - log_m)).sum(1) + (q * (torch.log(q + eps) - log_m)).sum(1))
    jsd = jsd.clamp(0.0, math.log(2.0))
    return torch.where(p_zero | q_zero, torch.full_like(jsd, float("nan")), jsd)


def topk_overlap(preds: Tensor, target: Tensor, mask: Tensor, k: Union[int, float] = 0.2) -> Tensor:
    r"""Jaccard overlap |A ∩ B| / |A ∪ B| of the two maps' top-k real tokens, per instance.

    ``k`` is an int (capped at each instance's length) or a fraction in (0, 1] of each instance's real tokens
    (``ceil(k·n)``, at least 1). Ties at the k-th score are broken by position (earlier first).

    Example:
        >>> import torch
        >>> a = torch.tensor([[4., 3., 2., 1.]]); b = torch.tensor([[4., 1., 2., 3.]])
        >>> topk_overlap(a, b, torch.ones(1, 4, dtype=torch.bool), k=2)
        tensor([0.3333], dtype=torch.float64)
    """
    check_maps(preds, target, mask=mask)
    sizes = resolve_k(k, mask.sum(1))
    a, b = topk_mask(preds, mask, sizes), topk_mask(target, mask, sizes)
    return (a & b).sum(1).double() / (a | b).sum(1).double()

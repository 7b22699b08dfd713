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
from lightning_xai.metrics.functional.divergence import jensen_shannon_divergence

__all__ = ["jensen_shannon", "jw_top_k", "kendall_tau", "pearson", "spearman", "topk_kendall_tau", "topk_overlap"]

# the pairwise signs are computed on blocks of at most this many elements ([rows, 2, K, W]; float32: 64 MiB)
_PAIR_BUDGET = 1 << 24
# dtypes whose values float32 holds exactly (float64 maps are checked value by value)
_FLOAT32_EXACT = (torch.float32, torch.float16, torch.bfloat16)


def _pair_stats(x: Tensor, y: Tensor, mask: Tensor, n: Tensor) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Per row: C − D over pairs of real tokens, the tied pairs of x and of y, and (only when a row has ties) the
    tie-group size of every token.

    Pads are set to 0 and every unordered pair is visited once: with the width made odd (W = T | 1), the cyclic
    shifts k = 1 … (W − 1)/2 pair token i with token (i + k) mod W, and each pair {i, j} occurs for exactly one
    (i, k). One subtraction and one ``sign_`` over ``[B, 2, K, W]`` give both maps' signs; one batched matmul of
    the signs with themselves gives Σ sx·sy (= C − D), Σ sx² and Σ sy² (the non-tied pairs) per row. A pair of a
    real token i with a pad (value 0) adds sign(x_i)·sign(y_i) and |sign(x_i)|, which is subtracted in O(T).
    All sums are of −1/0/+1 values: exact integers in float32 below 2^24 pairs.

    Args:
        x, y: ``[B, T]`` score maps; mask: ``[B, T]`` real tokens; n: ``[B]`` float64 real-token counts.

    Returns:
        ``(cmd [B], ties [B, 2], sizes [B, 2, T] or None)``, float64; ``sizes`` is None when no row has a tie.
    """
    B, T = x.shape
    W = T | 1  # odd: shifts 1 … K cover every unordered pair exactly once
    K = (W - 1) // 2
    real = mask.unsqueeze(1)
    both = torch.stack((x, y), 1).masked_fill_(~real, 0.0)
    # float32 keeps signs and sums exact if it holds every value (and the pair count stays below 2^24)
    exact32 = W * K < (1 << 24) and (both.dtype in _FLOAT32_EXACT or torch.equal(both.float().double(), both))
    dtype = torch.float32 if exact32 else torch.float64
    doubled = both.new_zeros((B, 2, 2 * W), dtype=dtype)
    doubled[:, :, :T] = both
    doubled[:, :, W:W + T] = both
    values, shifted = doubled[:, :, :W], doubled.unfold(2, W, 1)[:, :, 1:K + 1]  # shifted[.., k-1, i] = value i+k
    rows = max(1, _PAIR_BUDGET // max(1, 2 * K * W))
    block = torch.empty((min(rows, B), 2, K, W), dtype=dtype, device=x.device)

    def signs_of(start: int, stop: int) -> Tensor:  # [rows, 2, K, W]: sign(value_i − value_{i+k})
        return torch.sub(values[start:stop].unsqueeze(2), shifted[start:stop], out=block[:stop - start]).sign_()

    grams = []
    for start in range(0, B, rows):  # blocks of many instances each, not one per instance
        stop = min(B, start + rows)
        flat = signs_of(start, stop).view(stop - start, 2, K * W)
        grams.append(torch.bmm(flat, flat.transpose(1, 2)))
    token_signs = values.sign()  # [B, 2, W], 0 at pads
    pads = W - n
    # pairs (real i, pad j): their Σ sx·sy and Σ sx² are the Gram of the tokens' own signs, once per pad
    gram = torch.cat(grams).double() - pads.view(B, 1, 1) * torch.bmm(token_signs, token_signs.transpose(1, 2)).double()
    cmd = gram[:, 0, 1]
    ties = (n * (n - 1) / 2).unsqueeze(1) - torch.diagonal(gram, dim1=1, dim2=2)
    if not bool(ties.any()):
        return cmd, ties, None
    # tie-group sizes: #{j != i : x_j != x_i} over the full row = forward shifts + backward shifts
    sizes = torch.zeros((B, 2, W), dtype=torch.float64, device=x.device)
    tied_rows = ties.any(1)
    for start in range(0, B, rows):
        stop = min(B, start + rows)
        if not bool(tied_rows[start:stop].any()):
            continue
        d = block if rows >= B else signs_of(start, stop)  # one block: it still holds these signs
        twice = d.new_empty(d.shape[:3] + (2 * W,))  # |signs| twice along the row, for the backward shifts
        ahead = torch.abs(d, out=twice[..., :W])
        twice[..., W:] = ahead
        # behind[.., k-1, i] = |sign(value_{i-k} − value_i)|: row k of `twice` read from column W − k on
        behind = twice.as_strided(d.shape, (twice.stride(0), twice.stride(1), 2 * W - 1, 1),
                                  twice.storage_offset() + W - 1)
        sizes[start:stop] = (ahead.sum(2) + behind.sum(2)).double()
    # group size of real token i (itself included) = n − #{real j : x_j != x_i}; a pad differs iff x_i != 0
    sizes = n.view(B, 1, 1) - (sizes[:, :, :T] - pads.view(B, 1, 1) * token_signs[:, :, :T].abs().double())
    return cmd, ties, sizes.masked_fill_(~real | ~tied_rows.view(B, 1, 1), 1.0)  # rows without ties: all 1


def _tie_stats(sizes: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """From per-token tie-group sizes ``[B, 2, T]``: Σt(t−1)(t−2) and Σt(t−1)(2t+5) over groups, #distinct values."""
    real = mask.unsqueeze(1).double()
    t0 = ((sizes - 1) * (sizes - 2) * real).sum(2)
    t1 = ((sizes - 1) * (2 * sizes + 5) * real).sum(2)
    distinct = torch.floor((real / sizes).sum(2) + 0.5)
    return t0, t1, distinct


def kendall_tau(preds: Tensor, target: Tensor, mask: Tensor, variant: str = "b") -> Tuple[Tensor, Tensor]:
    r"""Kendall's τ between two score maps per instance over real tokens, with scipy's p-value.

    Equal to ``scipy.stats.kendalltau(preds[b][mask[b]], target[b][mask[b]], variant=variant)`` for every ``b``
    (defaults ``method="auto"``, two-sided): τ-b = (C − D) / √((n₀ − n₁)(n₀ − n₂)) with n₀ = n(n−1)/2 and
    n₁, n₂ the tied pairs of each map. The p-value is exact (Kendall's null distribution) when there are no ties
    and n ≤ 33 or min(C, D) ≤ 1, else the normal approximation with the tie-corrected variance — scipy's rule.
    Constant maps (and n = 1) give NaN, as in scipy. All instances are computed together from the pairwise signs
    of all rows at once (one subtraction, one sign, one batched matmul per block of rows), never with a loop over
    instances.

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
    if preds.shape[0] == 0:  # B = 0: no instance, an empty result (the metric classes' update is then a no-op)
        empty = torch.zeros(0, dtype=torch.float64, device=preds.device)
        return empty, empty.clone()
    n = mask.sum(1)
    nd = n.double()
    cmd, ties, sizes = _pair_stats(preds, target, mask, nd)
    tie_stats = None if sizes is None else _tie_stats(sizes, mask)  # only rows with ties need group sizes
    tot = nd * (nd - 1) / 2
    untied = tot.unsqueeze(1) - ties  # [B, 2]: n₀ − n₁, n₀ − n₂
    undefined = (untied == 0).any(1)  # constant map, or n = 1 (tot = 0)
    if variant == "b":
        denom = untied.sqrt().prod(1)  # √(n₀ − n₁)·√(n₀ − n₂), as scipy
        tau = cmd / denom.masked_fill(undefined, 1.0)
    else:
        distinct = nd.unsqueeze(1) if tie_stats is None else tie_stats[2]
        classes = distinct.min(1).values
        scale = nd ** 2 * (classes - 1) / classes
        tau = 2 * cmd / scale.masked_fill(undefined, 1.0)
    tau = tau.clamp(-1.0, 1.0)

    # p-values: scipy's method="auto"
    dis = (tot - cmd) / 2  # without ties every pair is concordant or discordant (only used then)
    c = torch.minimum(dis, tot - dis).long()
    exact = (ties == 0).all(1) & ((n <= KENDALL_EXACT_MAX_N) | (c <= 1))
    p = torch.zeros_like(tau)
    if bool(exact.any()):
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
        if tie_stats is None:  # no ties: the tie corrections are all zero
            var = m * (2 * nd + 5) / 18
        else:
            (x0, y0), (x1, y1) = (stat.unbind(1) for stat in tie_stats[:2])
            xtie, ytie = ties.unbind(1)
            safe_m = m.masked_fill(m == 0, 1.0)
            safe_m2 = (safe_m * (nd - 2)).masked_fill(nd <= 2, 1.0)
            var = (m * (2 * nd + 5) - x1 - y1) / 18 + 2 * xtie * ytie / safe_m + x0 * y0 / (9 * safe_m2)
        z = cmd / var.masked_fill(var <= 0, 1.0).sqrt()
        p_asym = torch.special.erfc(z.abs() / math.sqrt(2.0)).clamp(max=1.0)
        p = torch.where(exact, p, p_asym)
    return tau.masked_fill(undefined, float("nan")), p.masked_fill(undefined, float("nan"))


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
    if preds.shape[0] == 0:
        return kendall_tau(preds, target, mask, variant=variant)
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


def _correlation(preds: Tensor, target: Tensor, mask: Tensor, *, ranked: bool, p_two: float) -> Tuple[Tensor, Tensor]:
    """Pearson's r of the maps (of their average ranks if ``ranked``: Spearman's ρ) with the t-test p-value;
    ``p_two`` is the p-value at n = 2 (scipy: 1 for Pearson, NaN for Spearman); NaN where a map is constant."""
    check_maps(preds, target, mask=mask)
    n = mask.sum(1)
    undefined = _constant(preds, mask) | _constant(target, mask)
    if ranked:
        preds, target = _average_ranks(preds, mask), _average_ranks(target, mask)
    r = _masked_pearson(preds, target, mask)
    p = torch.where(n > 2, two_sided_t_pvalue(r, n), torch.full_like(r, p_two))
    nan = torch.full_like(r, float("nan"))
    return torch.where(undefined, nan, r), torch.where(undefined, nan, p)


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
    return _correlation(preds, target, mask, ranked=False, p_two=1.0)


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
    return _correlation(preds, target, mask, ranked=True, p_two=float("nan"))


def _normalise(scores: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    mass = scores.double().abs().masked_fill(~mask, 0.0)
    total = mass.sum(1, keepdim=True)
    zero = (total == 0).squeeze(1)
    return mass / torch.where(total > 0, total, torch.ones_like(total)), zero


def jensen_shannon(preds: Tensor, target: Tensor, mask: Tensor, eps: float = 1e-10) -> Tensor:
    r"""Jensen–Shannon divergence (natural log) between the two maps seen as distributions over real tokens.

    Each map is made non-negative with ``|·|`` and normalised to sum to 1 over the real tokens (pads get 0), then
    :func:`~lightning_xai.metrics.functional.divergence.jensen_shannon_divergence` — JSD(p, q) = ½ KL(p ‖ m) +
    ½ KL(q ‖ m), m = (p + q)/2 — is taken with Jain & Wallace's ε = 1e-10 inside the logarithms. Symmetric, in
    [0, ln 2]. With ``eps=0`` the exact divergence is computed (torchmetrics', equal to
    ``scipy.spatial.distance.jensenshannon(p, q) ** 2``); the ε version differs from it by less than 1e-8.
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
    jsd = jensen_shannon_divergence(p, q, eps).clamp(0.0, math.log(2.0))
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

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

from lightning_xai.metrics.functional._kendall_pairs import concordance, pair_elements
from lightning_xai.metrics.functional._special import KENDALL_EXACT_MAX_N, kendall_exact_table
from lightning_xai.metrics.functional._validation import check_maps, resolve_k, topk_mask
from lightning_xai.metrics.functional.correlation import pearson, spearman
from lightning_xai.metrics.functional.divergence import jensen_shannon_divergence

__all__ = ["jensen_shannon", "jw_top_k", "kendall_tau", "pearson", "spearman", "topk_kendall_tau", "topk_overlap"]

# rows are ranked in blocks of at most this many (row × padded width) elements; the kernel keeps a few int64
# arrays of that size alive (16 MiB each), whatever T is; on the pairwise path, blocks of at most this many pair
# signs (rows × 2 × T²/2; float32 or float64, and as many again for the tie-group sizes)
_BLOCK_ELEMENTS = 1 << 21
# rows of at most this many tokens take the pairwise path (_pair_stats), longer ones Knight's. Measured on 256 rows
# (1 thread, interleaved): pairwise 2-19x faster up to T = 112, at par with Knight at T = 128 with ties or float64
# maps, slower from T = 192 on (benchmarks/README.md, "Kendall τ: vectorised vs a scipy loop")
_PAIRWISE_MAX_T = 128


def _dense_ranks(values: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Per row: the 0-based dense rank of every value, the values sorted and the sorting permutation."""
    ordered, order = torch.sort(values, dim=1, stable=True)
    starts = torch.ones_like(ordered, dtype=torch.long)
    starts[:, 1:] = (ordered[:, 1:] != ordered[:, :-1]).long()
    ranks = torch.empty_like(starts).scatter_(1, order, torch.cumsum(starts, 1) - 1)
    return ranks, starts, order


def _group_stats(starts: Tensor, real: Tensor) -> Tensor:
    """``[B, 4]`` float64 over the tie groups (runs of equal sorted values) of the real tokens: Σ t(t−1)/2 (tied
    pairs), Σ t(t−1)(t−2), Σ t(t−1)(2t+5) and the number of groups. ``real`` is sorted like ``starts``."""
    group = torch.cumsum(starts, 1) - 1
    sizes = torch.zeros_like(group).scatter_add_(1, group, real.long()).double()
    return torch.stack(
        (
            sizes * (sizes - 1) / 2,
            sizes * (sizes - 1) * (sizes - 2),
            sizes * (sizes - 1) * (2 * sizes + 5),
            (sizes > 0).double(),
        ),
        2,
    ).sum(1)


def _inversions(sequence: Tensor) -> Tensor:
    """Per row: the pairs i < j with ``sequence[i] > sequence[j]`` (int64 ``[B]``), by bottom-up merge sort.

    Level w merges neighbouring sorted runs of w values: every value of a right run is inverted with the values
    of its left run above it (a batched ``searchsorted``); the same searches place every value in the merged run
    (left value i goes to i + #right values below it, right value j to j + #left values at most it). O(T log² T)
    time, O(T) memory per row, every row of the block at once.
    """
    B, T = sequence.shape
    width = 1 << max(0, (T - 1).bit_length())
    runs = sequence.new_full((B, width), int(sequence.max()) + 1 if T else 0)  # a maximum at the end adds none
    runs[:, :T] = sequence
    total = torch.zeros(B, dtype=torch.long, device=sequence.device)
    w = 1
    while w < width:
        pairs = runs.view(B, width // (2 * w), 2, w)
        left, right = pairs[:, :, 0].contiguous(), pairs[:, :, 1].contiguous()
        at_most = torch.searchsorted(left, right, right=True)  # values of the left run <= each right value
        total += (w - at_most).sum((1, 2))
        steps = torch.arange(w, device=runs.device)
        places = torch.stack((steps + torch.searchsorted(right, left), steps + at_most), 2)
        runs = (
            torch.empty_like(runs)
            .view(B, -1, 2 * w)
            .scatter_(2, places.view(B, -1, 2 * w), pairs.reshape(B, -1, 2 * w))
            .view(B, width)
        )
        w *= 2
    return total


def _map_stats(x: Tensor, y: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    """``(ranks [B, 2, T], stats [B, 2, 4])``: the dense ranks of both maps (pads ranked after every real token) and
    their tie statistics over the real tokens (:func:`_group_stats`)."""
    B, T = x.shape
    real = mask.unsqueeze(1)
    both = torch.stack((x, y), 1).double().masked_fill(~real, float("inf"))  # pads last; reals are finite
    ranks, starts, order = _dense_ranks(both.view(2 * B, T))
    stats = _group_stats(starts, mask.repeat_interleave(2, 0).gather(1, order)).view(B, 2, 4)
    return ranks.view(B, 2, T), stats


def _rank_stats(x: Tensor, y: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """Per row, over its real tokens, in O(T log T) memory-light passes (Knight's algorithm): C − D, the tied
    pairs of x and of y, and the tie statistics scipy's variance and τ-c need.

    The tokens are sorted by (x, y); then every discordant pair is an inversion of the y order (pairs tied in x
    are in ascending y), counted by merge sort; the pairs tied in both maps are the runs of equal (x, y).
    C − D = n₀ − n₁ − n₂ + n₃ − 2D. Pads are moved after every real token (x = y = +inf) and add nothing.

    Returns:
        ``(cmd [B], ties [B, 2], stats [B, 2, 4])`` float64; ``stats[:, i]`` holds map i's Σt(t−1)/2,
        Σt(t−1)(t−2), Σt(t−1)(2t+5) and number of distinct values (:func:`_group_stats`).
    """
    T = x.shape[1]
    ranks, stats = _map_stats(x, y, mask)
    key = ranks[:, 0] * (T + 1) + ranks[:, 1]  # lexicographic (x, y) as one integer
    joint, order = torch.sort(key, dim=1, stable=True)
    joint_starts = torch.ones_like(joint)
    joint_starts[:, 1:] = (joint[:, 1:] != joint[:, :-1]).long()
    both_tied = _group_stats(joint_starts, mask.gather(1, order))[:, 0]
    discordant = _inversions(ranks[:, 1].gather(1, order)).double()
    n = mask.sum(1).double()
    ties = stats[:, :, 0]
    cmd = n * (n - 1) / 2 - ties.sum(1) + both_tied - 2 * discordant
    return cmd, ties, stats


def _pair_stats(x: Tensor, y: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`_rank_stats` for short rows: C − D and the tied pairs from the signs of all pairs
    (:func:`~lightning_xai.metrics.functional._kendall_pairs.concordance`); the tie-group statistics from
    :func:`_map_stats`'s sorts where a row has ties, else none (n distinct values)."""
    cmd, ties = concordance(x, y, mask)
    if bool(ties.any()):
        return cmd, ties, _map_stats(x, y, mask)[1]
    stats = torch.zeros(x.shape[0], 2, 4, dtype=torch.float64, device=x.device)
    stats[:, :, 3] = mask.sum(1, keepdim=True).double()
    return cmd, ties, stats


def kendall_tau(preds: Tensor, target: Tensor, mask: Tensor, variant: str = "b") -> Tuple[Tensor, Tensor]:
    r"""Kendall's τ between two score maps per instance over real tokens, with scipy's p-value.

    Equal to ``scipy.stats.kendalltau(preds[b][mask[b]], target[b][mask[b]], variant=variant)`` for every ``b``
    (defaults ``method="auto"``, two-sided): τ-b = (C − D) / √((n₀ − n₁)(n₀ − n₂)) with n₀ = n(n−1)/2 and
    n₁, n₂ the tied pairs of each map. The p-value is exact (Kendall's null distribution) when there are no ties
    and n ≤ 33 or min(C, D) ≤ 1, else the normal approximation with the tie-corrected variance — scipy's rule.
    Constant maps (and n = 1) give NaN, as in scipy. All instances are computed together, per block of rows (never
    a loop over instances): rows of more than 128 tokens with Knight's O(T log T) algorithm (sorts and a batched
    merge-sort inversion count), so memory grows linearly with T — a 100,000-token pair takes a few tens of MiB,
    not the T² pairwise signs; shorter rows from the signs of all their pairs (one subtraction, one sign, one
    batched matmul per block of rows whose signs fit a fixed budget), several times faster there. Both give the
    same integers (C − D, tied pairs, tie groups), so the same τ and p-value.

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
    parts = []
    T = preds.shape[1]
    pairwise = T <= _PAIRWISE_MAX_T  # short rows: all pairs' signs, faster than Knight's passes
    stats_of = _pair_stats if pairwise else _rank_stats
    rows = max(1, _BLOCK_ELEMENTS // max(1, pair_elements(T) if pairwise else 1 << max(0, (T - 1).bit_length())))
    for start in range(0, preds.shape[0], rows):  # blocks of many instances each, not one per instance
        stop = start + rows
        parts.append(stats_of(preds[start:stop], target[start:stop], mask[start:stop]))
    cmd, ties, stats = (torch.cat(part) for part in zip(*parts))
    tot = nd * (nd - 1) / 2
    untied = tot.unsqueeze(1) - ties  # [B, 2]: n₀ − n₁, n₀ − n₂
    undefined = (untied == 0).any(1)  # constant map, or n = 1 (tot = 0)
    if variant == "b":
        denom = untied.sqrt().prod(1)  # √(n₀ − n₁)·√(n₀ − n₂), as scipy
        tau = cmd / denom.masked_fill(undefined, 1.0)
    else:
        distinct = stats[:, :, 3]
        classes = distinct.min(1).values
        scale = nd**2 * (classes - 1) / classes
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
        (x0, y0), (x1, y1) = stats[:, :, 1].unbind(1), stats[:, :, 2].unbind(1)
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


def topk_kendall_tau(
    preds: Tensor, target: Tensor, mask: Tensor, k: Optional[Union[int, float]] = None, variant: str = "b"
) -> Tuple[Tensor, Tensor]:
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
    # p, q are normalised here (all-zero rows have no distribution: NaN below)
    jsd = jensen_shannon_divergence(p, q, eps, check=False).clamp(0.0, math.log(2.0))
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

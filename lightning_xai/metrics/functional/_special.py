"""Special functions the p-values need, vectorised in torch (float64): the exact Kendall null distribution and
the regularised incomplete beta function. scipy is not a runtime dependency of lightning_xai."""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

__all__ = ["betainc", "kendall_exact_table", "two_sided_t_pvalue", "KENDALL_EXACT_MAX_N"]

#: scipy's ``kendalltau(method="auto")`` uses the exact null distribution up to this many tokens (no ties).
KENDALL_EXACT_MAX_N = 33


@lru_cache(maxsize=None)
def _kendall_exact_table_cpu() -> Tensor:
    """``P[n, c]``: two-sided exact p-value for n items and c = min(concordant, discordant), as scipy computes it.

    Built with the same recurrence as ``scipy.stats._mstats_basic._kendall_p_exact`` (Kendall 1970): the
    Mahonian counts of permutations with c inversions, summed and divided by n!.
    """
    n_max = KENDALL_EXACT_MAX_N
    c_max = n_max * (n_max - 1) // 4
    table = torch.ones(n_max + 1, c_max + 1, dtype=torch.float64)
    for n in range(3, n_max + 1):
        tot = n * (n - 1) // 2
        c_hi = tot // 2
        new = [0.0] * (c_hi + 1)
        new[0] = 1.0
        if c_hi >= 1:
            new[1] = 1.0
        counts = torch.tensor(new, dtype=torch.float64)
        for j in range(3, n + 1):
            counts = torch.cumsum(counts, 0)
            if j <= c_hi:
                counts[j:] = counts[j:] - counts[: c_hi + 1 - j]
        prob = 2.0 * torch.cumsum(counts, 0) / float(math.factorial(n))
        prob[0] = 2.0 / float(math.factorial(n))
        if c_hi >= 1:
            prob[1] = 2.0 / float(math.factorial(n - 1))
        if 4 * c_hi == n * (n - 1):
            prob[c_hi] = 1.0
        table[n, : c_hi + 1] = prob.clamp(0.0, 1.0)
    return table


def kendall_exact_table(device: torch.device) -> Tensor:
    """The exact two-sided p-value table ``[34, 265]`` on ``device`` (built once)."""
    return _kendall_exact_table_cpu().to(device)


def _betacf(a: Tensor, b: Tensor, x: Tensor, max_iter: int = 2000, tol: float = 1e-16) -> Tensor:
    """Continued fraction of the incomplete beta function (modified Lentz), vectorised."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = torch.ones_like(x)
    d = 1.0 - qab * x / qap
    d = torch.where(d.abs() < tiny, torch.full_like(d, tiny), d)
    d = 1.0 / d
    h = d.clone()
    done = torch.zeros_like(x, dtype=torch.bool)
    for m in range(1, max_iter + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = torch.where(d.abs() < tiny, torch.full_like(d, tiny), d)
        c = 1.0 + aa / c
        c = torch.where(c.abs() < tiny, torch.full_like(c, tiny), c)
        d = 1.0 / d
        h = torch.where(done, h, h * d * c)
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = torch.where(d.abs() < tiny, torch.full_like(d, tiny), d)
        c = 1.0 + aa / c
        c = torch.where(c.abs() < tiny, torch.full_like(c, tiny), c)
        d = 1.0 / d
        delta = d * c
        h = torch.where(done, h, h * delta)
        done = done | ((delta - 1.0).abs() < tol)
        if bool(done.all()):
            break
    return h


def betainc(a: Tensor, b: Tensor, x: Tensor) -> Tensor:
    """Regularised incomplete beta ``I_x(a, b)`` elementwise (float64), for a, b > 0 and x in [0, 1].

    Example:
        >>> import torch
        >>> round(float(betainc(torch.tensor(2.0), torch.tensor(3.0), torch.tensor(0.4))), 6)
        0.5248
    """
    a, b, x = torch.broadcast_tensors(a.double(), b.double(), x.double())
    out = torch.full_like(x, float("nan"))
    out = torch.where(x <= 0, torch.zeros_like(x), out)
    out = torch.where(x >= 1, torch.ones_like(x), out)
    inner = (x > 0) & (x < 1) & (a > 0) & (b > 0)
    if not bool(inner.any()):
        return out
    ai, bi, xi = a[inner], b[inner], x[inner]
    log_front = torch.lgamma(ai + bi) - torch.lgamma(ai) - torch.lgamma(bi) + ai * torch.log(xi) + bi * torch.log1p(-xi)
    flip = xi > (ai + 1.0) / (ai + bi + 2.0)
    aa, bb, xx = torch.where(flip, bi, ai), torch.where(flip, ai, bi), torch.where(flip, 1.0 - xi, xi)
    cf = _betacf(aa, bb, xx)
    front = torch.exp(log_front)
    value = torch.where(flip, 1.0 - front * cf / bi, front * cf / ai)
    out[inner] = value.clamp(0.0, 1.0)
    return out


def two_sided_t_pvalue(r: Tensor, n: Tensor) -> Tensor:
    """Two-sided p-value of a correlation ``r`` from ``n`` pairs under the t / beta null: ``I_{1−r²}((n−2)/2, ½)``."""
    r = r.double()
    df = (n - 2).double()
    x = (1.0 - r * r).clamp(0.0, 1.0)
    p = betainc(df / 2.0, torch.full_like(df, 0.5), x)
    p = torch.where(x == 0, torch.zeros_like(p), p)
    return p.clamp(0.0, 1.0)

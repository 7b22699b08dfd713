"""Quadrature rules on [0, 1] for Integrated Gradients: Gauss–Legendre, Captum's Riemann rules, and the
Gauss–Kronrod G7/K15 pair behind ``n_steps="auto"``. Pure numerics (float64 numpy), no model."""

from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["IG_RULES", "gauss_kronrod_nodes", "ig_nodes"]

IG_RULES = ("gauss_legendre", "riemann_left", "riemann_middle", "riemann_right", "riemann_trapezoid")


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
_GK15_NODES = np.array(
    [
        -0.991455371120812639206854697526329,
        -0.949107912342758524526189684047851,
        -0.864864423359769072789712788640926,
        -0.741531185599394439863864773280788,
        -0.586087235467691130294144838258730,
        -0.405845151377397166906606412076961,
        -0.207784955007898467600689403773245,
        0.0,
        0.207784955007898467600689403773245,
        0.405845151377397166906606412076961,
        0.586087235467691130294144838258730,
        0.741531185599394439863864773280788,
        0.864864423359769072789712788640926,
        0.949107912342758524526189684047851,
        0.991455371120812639206854697526329,
    ]
)
_K15_WEIGHTS = np.array(
    [
        0.022935322010529224963732008058970,
        0.063092092629978553290700663189204,
        0.104790010322250183839876322541518,
        0.140653259715525918745189590510238,
        0.169004726639267902826583426598550,
        0.190350578064785409913256402421014,
        0.204432940075298892414161999234649,
        0.209482141084727828012999174891714,
        0.204432940075298892414161999234649,
        0.190350578064785409913256402421014,
        0.169004726639267902826583426598550,
        0.140653259715525918745189590510238,
        0.104790010322250183839876322541518,
        0.063092092629978553290700663189204,
        0.022935322010529224963732008058970,
    ]
)
_G7_WEIGHTS = np.array(
    [
        0.129484966168869693270611432679082,
        0.279705391489276667901467771423780,
        0.381830050505118944950369775488975,
        0.417959183673469387755102040816327,
        0.381830050505118944950369775488975,
        0.279705391489276667901467771423780,
        0.129484966168869693270611432679082,
    ]
)


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

"""Divergences between distributions over the last dimension: KL, Jensen–Shannon and total variation.

The one implementation every layer uses: the agreement metric :func:`~lightning_xai.metrics.functional.jensen_shannon`
(score maps, normalised over real tokens), the adversarial search and seed variance in :mod:`lightning_xai.audits`,
and the losses in :mod:`lightning_xai.losses`, which differentiate through them.

With ``eps > 0`` (the default, ``eps = 1e-10``) the formulas are Jain & Wallace's official code: natural log, ``eps``
inside the logarithms, inputs clamped to ``[0, 1]``; they broadcast over leading dimensions (``[B, K, T]``
candidates against ``[B, 1, T]``) and their gradients stay finite where a distribution has zero mass (pads). With
``eps = 0`` the exact divergences are torchmetrics' own (:func:`torchmetrics.functional.kl_divergence`,
:func:`torchmetrics.functional.regression.jensen_shannon_divergence`, which renormalise their inputs and give
``0·log 0 = 0``); their gradients are NaN at zero-mass entries, so do not train through ``eps=0``.

Inputs are checked (:func:`~lightning_xai.metrics.functional._validation.check_distributions`): NaN/inf, negative
entries (logits), rows that do not sum to 1 and shapes that do not broadcast raise a ``ValueError`` naming the
rows and the fix, instead of a number outside the divergence's range (the JSD of logits is not ≤ ln 2).
``check=False`` skips them (one host synchronisation per call): for the training losses, which run every step
on the model's own attention and turn a non-finite batch into a zero loss with a warning themselves
(:class:`~lightning_xai.losses._common.FiniteGuard`), and for callers that normalised the inputs themselves.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional import kl_divergence as _tm_kl_divergence
from torchmetrics.functional.regression import jensen_shannon_divergence as _tm_jensen_shannon_divergence

from lightning_xai.metrics.functional._validation import check_distributions

__all__ = ["EPS", "jensen_shannon_divergence", "kl_divergence", "total_variation"]

#: Jain & Wallace's stabiliser inside the logarithms
EPS = 1e-10


def _exact(measure, p: Tensor, q: Tensor) -> Tensor:
    """torchmetrics' exact divergence per distribution, for any broadcastable leading shape."""
    p, q = torch.broadcast_tensors(p, q)
    shape = p.shape[:-1]
    flat = measure(p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1]), reduction="none")
    return flat.reshape(shape)


def _check_eps(eps: float) -> None:
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0 (0: the exact divergence), got {eps}.")


def kl_divergence(p: Tensor, q: Tensor, eps: float = EPS, *, check: bool = True) -> Tensor:
    """KL(p ‖ q) = Σ p·(log(p+eps) − log(q+eps)) over the last dimension (Jain & Wallace's ``kld``).

    Zero entries of ``p`` (pads) contribute exactly 0. ``eps=0``: the exact KL (torchmetrics).

    Example:
        >>> p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.25, 0.75, 0.0])
        >>> round(kl_divergence(p, q).item(), 4), round(kl_divergence(p, q, eps=0.0).item(), 4)
        (0.1438, 0.1438)
    """
    _check_eps(eps)
    if check:
        check_distributions(p, q)
    return _kl(p, q, eps)


def _kl(p: Tensor, q: Tensor, eps: float) -> Tensor:
    if eps == 0.0:
        return _exact(_tm_kl_divergence, p, q)
    p = p.clamp(0.0, 1.0)
    q = q.clamp(0.0, 1.0)
    log_q = torch.log(q + eps)
    if q.requires_grad:
        # the value keeps Jain & Wallace's eps, the gradient is the exact KL's d log q = dq / q: through
        # log(q + eps) it is dq / (q + eps), which vanishes where q << eps (near one-hot attention: a loss of 8
        # with no gradient at all); where q underflows to 0 no gradient is left either way
        kept = q.clamp_min(torch.finfo(q.dtype).tiny)
        log_q = log_q.detach() + (torch.log(kept) - torch.log(kept).detach())
    return (p * (torch.log(p + eps) - log_q)).sum(-1)


def jensen_shannon_divergence(p: Tensor, q: Tensor, eps: float = EPS, *, check: bool = True) -> Tensor:
    """JSD(p, q) = ½KL(p‖m) + ½KL(q‖m), m = ½(p+q), natural log, over the last dimension (≤ ln 2).

    ``eps=0``: the exact JSD (torchmetrics), equal to ``scipy.spatial.distance.jensenshannon(p, q) ** 2``.

    Example:
        >>> p, q = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
        >>> round(jensen_shannon_divergence(p, q).item(), 4)  # ln 2, the maximum
        0.6931
    """
    _check_eps(eps)
    if check:
        check_distributions(p, q)
    if eps == 0.0:
        return _exact(_tm_jensen_shannon_divergence, p, q)
    m = 0.5 * (p + q)
    return 0.5 * (_kl(p, m, eps) + _kl(q, m, eps))


def total_variation(p: Tensor, q: Tensor, *, check: bool = True) -> Tensor:
    """TVD(p, q) = ½ Σ |p − q| over the last dimension (classes).

    For two classes this equals ``|p₁ − q₁|``, the single-output difference Jain & Wallace and Wiegreffe &
    Pinter compute on the positive-class probability.

    Example:
        >>> total_variation(torch.tensor([0.9, 0.1]), torch.tensor([0.7, 0.3]))
        tensor(0.2000)
    """
    if check:
        check_distributions(p, q)
    return 0.5 * (p - q).abs().sum(-1)

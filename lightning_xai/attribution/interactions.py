"""Integrated Hessians (Janizek, Sturmfels & Lee 2021): token-pair interactions ``[B, T, T]``.

Token saliency cannot say that two tokens matter *together*. Integrated Hessians explains each token's
Integrated Gradients attribution with Integrated Gradients again: with baseline x′, δ = x − x′ and

    IG_s(z) = Σ_{d∈s} (z_d − x′_d) ∫₀¹ ∂F/∂z_d (x′ + β(z − x′)) dβ     (the IG of token s at input z),
    Γ_st    = Σ_{e∈t} δ_e ∫₀¹ ∂IG_s/∂z_e (x′ + αδ) dα,

where d runs over the embedding entries of token s and e over those of token t. For s ≠ t this is
Σ_{d∈s, e∈t} δ_d δ_e ∫∫ αβ ∂²F/∂z_d∂z_e (x′ + αβδ) dα dβ (symmetric in s, t); the diagonal Γ_ss adds token s's
main effect. Because IG_s(x′) = 0, IG's completeness applied to IG_s gives **Σ_t Γ_st = IG_s(x)**: the
interactions split each token's attribution among its partners.

Both integrals use Gauss–Legendre rules (``n_steps`` nodes in α, ``inner_steps`` in β). The inner gradient is
built with ``create_graph=True`` and each real token's IG_s is differentiated once per α chunk: the cost is
about ``n_steps × inner_steps`` forward+backward passes plus ``T`` double-backward passes per α chunk.

``attribute(model, batch, "integrated_hessians")`` returns ``(Σ_t Γ_st [B, T], Γ [B, T, T])`` — the first
element is the ``[B, T]`` map every attribution method returns (equal to IG up to quadrature), the second the
interactions; call :func:`integrated_hessians` for Γ alone.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.attribution.core import attribute, resolve_target, target_score
from lightning_xai.attribution.gradients import _rows_per_pass
from lightning_xai.attribution.ig_path import _baseline
from lightning_xai.attribution.quadrature import ig_nodes
from lightning_xai.attribution.registry import PAIRWISE_INTERACTIONS, register_method

__all__ = ["integrated_hessians", "integrated_hessians_map"]


def _inner_ig(
    model: ExplainableModel,
    batch: Batch,
    z: Tensor,
    base: Tensor,
    target: Tensor,
    betas: Tensor,
    weights: Tensor,
    output: str,
    create_graph: bool,
) -> Tensor:
    """``[K, N, T]``: IG of every token at the inputs ``z`` ``[K, N, T, E]`` (baseline ``base``), β rule given."""
    K, N, T, E = z.shape
    L = betas.numel()
    path = base + betas.view(L, 1, 1, 1, 1) * (z - base).unsqueeze(0)  # [L, K, N, T, E]
    rows = torch.arange(N, device=z.device).repeat(L * K)
    logits = model.forward_from_embeddings(path.reshape(L * K * N, T, E), gather_rows(batch, rows, N)).logits
    score = target_score(logits, target.index_select(0, rows), output, head_kind_of(model))
    (grad,) = torch.autograd.grad(score.sum(), path, create_graph=create_graph)
    averaged = (grad * weights.view(L, 1, 1, 1, 1)).sum(0)  # ∫ ∂F dβ at each z, [K, N, T, E]
    return ((z - base) * averaged).sum(-1)


def integrated_hessians_map(
    model: ExplainableModel,
    batch: Batch,
    embeddings: Tensor,
    target: Any = None,
    *,
    n_steps: int = 16,
    inner_steps: Optional[int] = None,
    baseline: Any = "zero",
    output: str = "probability",
    pad_token_id: Optional[int] = None,
    internal_batch_size: Union[int, str, None] = "auto",
    warn_threshold: float = 0.01,
) -> Tuple[Tensor, Tensor]:
    """``(Γ [B, T, T], delta [B, T])`` for ``embeddings`` (call inside :func:`explanation_context`).

    ``delta = Σ_t Γ_st − IG_s(x)``, IG computed with the same ``inner_steps`` Gauss–Legendre rule; a warning is
    raised when some row's \\|delta\\| exceeds ``warn_threshold`` of that row's Σ_s \\|IG_s\\| (raise ``n_steps``).
    Rows and columns of non-tokens are 0. ``internal_batch_size`` bounds the rows (α nodes × β nodes × B) per
    pass; at least one α node is taken per pass.
    """
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be a positive int; got {n_steps!r}.")
    inner_steps = n_steps if inner_steps is None else inner_steps
    if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
        raise ValueError(f"inner_steps must be a positive int or None; got {inner_steps!r}.")
    N, T, E = embeddings.shape
    mask = model.token_mask(batch)
    embeddings = embeddings.detach()
    base = _baseline(model, batch, embeddings, baseline, pad_token_id).detach()
    with torch.no_grad():
        target = resolve_target(model.forward_from_embeddings(embeddings, batch).logits, target)
    as_tensor = lambda a: torch.as_tensor(a, dtype=embeddings.dtype, device=embeddings.device)  # noqa: E731
    alphas, alpha_w = map(as_tensor, ig_nodes(n_steps))
    betas, beta_w = map(as_tensor, ig_nodes(inner_steps))
    rows = _rows_per_pass(internal_batch_size, T, E, embeddings.device)
    per_pass = max(1, rows // (inner_steps * N))
    delta_x = embeddings - base
    tokens = [s for s in range(T) if bool(mask[:, s].any())]
    gamma = embeddings.new_zeros(N, T, T)
    for first in range(0, n_steps, per_pass):
        a, w = alphas[first : first + per_pass], alpha_w[first : first + per_pass]
        z = (base + a.view(-1, 1, 1, 1) * delta_x).requires_grad_(True)  # [K, N, T, E]
        ig_z = _inner_ig(model, batch, z, base, target, betas, beta_w, output, create_graph=True)
        for s in tokens:
            (hess,) = torch.autograd.grad(ig_z[:, :, s].sum(), z, retain_graph=True)
            gamma[:, s, :] += ((hess * delta_x).sum(-1) * w.view(-1, 1, 1)).sum(0).detach()
    real = mask.to(gamma.dtype)
    gamma = gamma * real.unsqueeze(2) * real.unsqueeze(1)
    start = embeddings.unsqueeze(0).clone().requires_grad_(True)
    ig_x = _inner_ig(model, batch, start, base, target, betas, beta_w, output, create_graph=False)[0].detach() * real
    delta = gamma.sum(-1) - ig_x
    scale = ig_x.abs().sum(1)
    bad = delta.abs().amax(1) > warn_threshold * scale.clamp_min(torch.finfo(scale.dtype).tiny)
    if bool(bad.any()):
        warnings.warn(
            f"Integrated Hessians: sum_t Gamma_st misses IG_s by more than {warn_threshold:.0%} of the "
            f"row's sum |IG| for {int(bad.sum())} of {N} rows; raise n_steps.",
            RuntimeWarning,
            stacklevel=4,
        )
    return gamma, delta


def integrated_hessians(
    model: Any,
    batch: Batch,
    target: Any = None,
    *,
    n_steps: int = 16,
    inner_steps: Optional[int] = None,
    baseline: Any = "zero",
    output: str = "probability",
    pad_token_id: Optional[int] = None,
    internal_batch_size: Union[int, str, None] = "auto",
    return_convergence_delta: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Token-pair interactions Γ ``[B, T, T]`` of any :class:`ExplainableModel` (Integrated Hessians).

    Args:
        model: an explainable model.
        batch: a dict batch.
        target: ``None`` (predicted class), an int, or ``LongTensor[B]``.
        n_steps: Gauss–Legendre nodes of the outer (α) integral.
        inner_steps: nodes of the inner (β) integral (default ``n_steps``).
        baseline: ``"zero"``, ``"pad"`` or a ``[B, T, E]`` tensor, as for Integrated Gradients.
        output: the differentiated score: ``"probability"``, ``"logit"`` or ``"log_probability"``.
        pad_token_id: pad id for ``baseline="pad"``.
        internal_batch_size: rows per pass (``"auto"``).
        return_convergence_delta: also return ``delta [B, T] = Σ_t Γ_st − IG_s`` (completeness error).

    Returns:
        Γ, 0 in the rows and columns of non-tokens; ``Γ.sum(-1)`` is Integrated Gradients' map.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=6, hidden_dim=3).double()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> gamma, delta = integrated_hessians(model, batch, n_steps=8, return_convergence_delta=True)
        >>> gamma.shape, bool(delta.abs().max() < 1e-6), gamma[1, 2].abs().sum().item()
        (torch.Size([2, 3, 3]), True, 0.0)
    """
    result = attribute(
        model,
        batch,
        "integrated_hessians",
        target,
        n_steps=n_steps,
        inner_steps=inner_steps,
        baseline=baseline,
        output=output,
        pad_token_id=pad_token_id,
        internal_batch_size=internal_batch_size,
        return_convergence_delta=return_convergence_delta,
    )
    return (result[1], result[2]) if return_convergence_delta else result[1]


@register_method(
    "integrated_hessians",
    resolves_target=True,
    precision_sensitive=True,
    returns=PAIRWISE_INTERACTIONS,
    unshardable="its second-order gradients through FSDP2's hooks crash the process (a segmentation "
    "fault on CPU, torch 2.13)",
)
def _integrated_hessians(
    model: ExplainableModel,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    n_steps: int = 16,
    inner_steps: Optional[int] = None,
    baseline: Any = "zero",
    output: str = "probability",
    pad_token_id: Optional[int] = None,
    internal_batch_size: Union[int, str, None] = "auto",
    return_convergence_delta: bool = False,
) -> Tuple[Tensor, ...]:
    if create_graph:
        raise ValueError(
            "integrated_hessians does not support create_graph=True (its maps are built from "
            "double-backward passes and returned detached); use integrated_gradients in losses."
        )
    with torch.no_grad():
        embeddings = model.embed(batch)
    gamma, delta = integrated_hessians_map(
        model,
        batch,
        embeddings,
        target,
        n_steps=n_steps,
        inner_steps=inner_steps,
        baseline=baseline,
        output=output,
        pad_token_id=pad_token_id,
        internal_batch_size=internal_batch_size,
    )
    return (gamma.sum(-1), gamma, delta) if return_convergence_delta else (gamma.sum(-1), gamma)

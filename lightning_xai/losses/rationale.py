"""Supervised attention (Strout et al. 2019; Zhong et al. 2019): train attention toward human rationales."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.losses._common import (
    FiniteGuard,
    as_float,
    bool_batch_mask,
    check_weight,
    log_extra,
    require_finite,
    token_mask,
)
from lightning_xai.metrics.functional.divergence import kl_divergence

__all__ = ["RationaleSupervisionLoss", "rationale_supervision"]

KINDS = ("kl", "cross_entropy", "mass")
_EPS = 1e-10


def rationale_supervision(attention: Tensor, rationale: Tensor, mask: Tensor, kind: str = "kl") -> Tensor:
    """Per-example ``[B]`` distance of ``attention`` from the rationale ``rationale`` (bool ``[B, T]``).

    With r̂ = the rationale as a distribution (1/|R| on its real tokens):

    * ``"kl"``: KL(r̂ ‖ α) — 0 when attention is uniform over the rationale;
    * ``"cross_entropy"``: −Σ_t r̂_t log α_t = KL(r̂ ‖ α) + log |R| (same gradients as ``"kl"``, Zhong et al.'s
      form);
    * ``"mass"``: −log Σ_{t∈R} α_t — only asks attention to sit inside the rationale, however it is spread there.

    Rows whose rationale has no real token give 0.

    Raises:
        ValueError: an unknown kind, mismatched shapes, or NaN or infinite attention.

    Example:
        >>> a = torch.tensor([[0.5, 0.5, 0.0]])
        >>> r, m = torch.tensor([[True, False, False]]), torch.tensor([[True, True, True]])
        >>> [round(rationale_supervision(a, r, m, k).item(), 4) for k in ("kl", "cross_entropy", "mass")]
        [0.6931, 0.6931, 0.6931]
    """
    require_finite("rationale_supervision", attention=attention)
    return _rationale_terms(attention, rationale, mask, kind)


def _rationale_terms(attention: Tensor, rationale: Tensor, mask: Tensor, kind: str) -> Tensor:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    if rationale.shape != attention.shape:
        raise ValueError(
            f"the rationale has shape {tuple(rationale.shape)} but the attention "
            f"{tuple(attention.shape)}; "
            "both must be [B, T] over the same positions."
        )
    inside = as_float(rationale.bool() & mask.bool(), attention)
    count = inside.sum(-1)
    has = count > 0
    if kind == "mass":
        values = -torch.log((attention * inside).sum(-1) + _EPS)
    else:
        target = inside / count.clamp_min(1.0).unsqueeze(-1)
        values = kl_divergence(target, attention, eps=_EPS, check=False)
        if kind == "cross_entropy":
            values = values + torch.log(count.clamp_min(1.0))
    return torch.where(has, values, torch.zeros_like(values))


class RationaleSupervisionLoss(FiniteGuard, nn.Module):
    """weight · mean_b distance(α_b, rationale_b): attention pulled toward the human rationale ``batch[key]``.

    The rationale is a bool ``[B, T]`` mask aligned with the attention (ERASER movies' ``rationale`` from
    :class:`~lightning_xai.data.TextClassificationDataModule`); see :func:`rationale_supervision` for ``kind``.
    The mean runs over the examples that have rationale tokens (examples without any contribute nothing and are
    counted in :attr:`empty_examples`, logged as ``train/<name>_empty``); the attention mass on the rationale of
    the last batch is kept in :attr:`last_mass` and logged as ``train/<name>_mass``. Gradients reach the
    attention scorer and everything below it, never the classifier head.

    **Supervised alignment on a generator** (a causal LM or an encoder–decoder through
    :class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`, whose output sets ``target_steps``):
    ``batch[key]`` is a bool ``[B, K, T]`` mask, True at the source positions aligned with target step ``k`` (the gold
    word links of that step's target word, on its word pieces), and each step's attention over the source
    (``extras["step_attention"]``) is pulled toward it, as in supervised attention for translation (Liu et al.
    2016; Garg et al. 2019). The mean runs over the real target steps that have a link; the others count as
    :attr:`empty_examples`.

    Args:
        weight: loss weight.
        key: the batch key of the rationale mask.
        kind: ``"kl"``, ``"cross_entropy"`` or ``"mass"``.
        name: the logged name (``train/<name>``).

    Example:
        >>> from lightning_xai.adapters import ExplainOutput
        >>> out = ExplainOutput(logits=torch.zeros(1, 2), attention=torch.tensor([[0.5, 0.25, 0.25]]))
        >>> batch = {"rationale": torch.tensor([[True, False, False]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> RationaleSupervisionLoss(weight=2.0)(out, batch)  # 2·log 2
        tensor(1.3863)
    """

    def __init__(self, weight: float = 1.0, key: str = "rationale", kind: str = "kl", name: str = "rationale") -> None:
        super().__init__()
        weight = check_weight(weight, "RationaleSupervisionLoss")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a batch key (a non-empty string), got {key!r}.")
        self.weight = float(weight)
        self.key = key
        self.kind = kind
        self.name = name
        self.empty_examples = 0
        self.seen_examples = 0
        self.last_mass: Tensor | None = None

    def forward(self, outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
        rationale = bool_batch_mask(
            batch,
            self.key,
            "RationaleSupervisionLoss",
            "True at rationale tokens; use a dataset with rationales (eraser_movies) or set key= to your batch's key",
        )
        attention = outputs.attention
        mask = token_mask(outputs, batch, model).to(attention.device)
        rationale = rationale.to(attention.device)
        real = None
        if outputs.target_steps is not None:  # a generator: one distribution, one rationale per target step
            attention, mask, real = _step_view(outputs, rationale, mask, self.key)
        values = _rationale_terms(attention, rationale, mask, self.kind)
        has = (rationale & mask).any(-1)
        if real is not None:
            has = has & real
            values = values * real
        size = int(has.shape[0])
        counted = has.numel() if real is None else int(real.sum())
        self.empty_examples += counted - int(has.sum())
        self.seen_examples += counted
        masses = (attention.detach() * as_float(rationale & mask, attention)).sum(-1)
        self.last_mass = masses.mean() if real is None else masses[real].mean()
        log_extra(model, f"train/{self.name}_mass", self.last_mass, size)
        log_extra(model, f"train/{self.name}_empty", float(counted - int(has.sum())), size)
        value = self.weight * values.sum() / has.sum().clamp_min(1)
        return self.finite_or_zero(value, model, attention=attention)

    def extra_repr(self) -> str:
        return f"weight={self.weight}, key={self.key!r}, kind={self.kind!r}"


def _step_view(outputs: ExplainOutput, rationale: Tensor, mask: Tensor, key: str) -> "tuple[Tensor, Tensor, Tensor]":
    """A generator's ``(step attention [B, K, T], source mask [B, 1, T], real steps [B, K])`` for a ``[B, K, T]``
    rationale."""
    steps = outputs.target_steps
    attention = (outputs.extras or {}).get("step_attention")
    if steps is None or attention is None:
        raise ValueError(
            "RationaleSupervisionLoss: a generator's output without extras['step_attention'] (each "
            "target step's attention over the source); use HuggingFaceGenerationAdapter."
        )
    if rationale.shape != attention.shape:
        raise ValueError(
            f"RationaleSupervisionLoss on a generator: batch[{key!r}] has shape "
            f"{tuple(rationale.shape)}, expected [B, K, T] = {tuple(attention.shape)}: for each target "
            "step, True at the source positions aligned with it (its gold links on word pieces)."
        )
    return attention, mask[:, None, :], steps.bool()

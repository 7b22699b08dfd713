"""A differentiable erasure objective: make the tokens attention ranks highest the ones the decision needs."""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.losses._common import FiniteGuard, check_weight, log_extra, require_model, token_mask

__all__ = ["ErasureFaithfulnessLoss", "soft_top_k_mask"]

_MODES = ("attention", "input")


def soft_top_k_mask(
    attention: Tensor, mask: Tensor, fraction: float, temperature: float = 0.1, eps: float = 1e-12
) -> Tensor:
    """A soft indicator ``[B, T]`` of the top ``fraction`` of real tokens by attention.

    k_b = round(fraction·L_b) clamped to [1, L_b − 1]; the threshold τ_b is the geometric mean of the k-th and
    (k+1)-th largest attention values; m = σ((log α − log τ)/temperature) on real tokens, 0 elsewhere. The
    sigmoid acts on log-attention so the softness does not depend on the sentence length. τ is a
    differentiable function of α (through the sort), so the whole mask is.

    Example:
        >>> a = torch.tensor([[0.7, 0.2, 0.1, 0.0]])
        >>> soft_top_k_mask(a, torch.tensor([[True, True, True, False]]), fraction=0.3, temperature=0.05).round()
        tensor([[1., 0., 0., 0.]])
    """
    lengths = mask.sum(-1)
    k = (fraction * lengths.to(attention.dtype)).round().long().clamp(min=1)
    k = torch.minimum(k, (lengths - 1).clamp(min=1))
    log_att = torch.log(attention.clamp_min(eps)).masked_fill(~mask, float("-inf"))
    ordered, _ = log_att.sort(dim=-1, descending=True)
    upper = ordered.gather(-1, (k - 1).unsqueeze(-1))
    lower = ordered.gather(-1, k.clamp(max=attention.shape[-1] - 1).unsqueeze(-1))
    lower = torch.where(torch.isfinite(lower), lower, upper - 1.0)
    threshold = 0.5 * (upper + lower)
    soft = torch.sigmoid((log_att.masked_fill(~mask, 0.0) - threshold) / temperature)
    return soft * mask.to(attention.dtype)


class ErasureFaithfulnessLoss(FiniteGuard, nn.Module):
    """Differentiable comprehensiveness and sufficiency of the top-attention tokens (ERASER-style).

    With ŷ the predicted class (argmax, no gradient), p(·) its probability and m the soft top-k mask of
    :func:`soft_top_k_mask` (the top ``fraction`` of real tokens by attention)::

        comprehensiveness = p(ŷ | x) − p(ŷ | x with the top tokens erased)      (want large)
        sufficiency       = p(ŷ | x) − p(ŷ | only the top tokens)               (want small)
        loss = weight · mean_b [ sufficiency_weight · suff − comprehensiveness_weight · comp ]

    Erasure modes:

    * ``"attention"`` (default) — erase in attention space with the encoder's outputs held fixed, as in
      Serrano & Smith's erasure test: α_comp ∝ α·(1 − m), α_suff ∝ α·m, renormalised over real tokens and
      passed as ``attention_override``. Minimising the loss makes the decision flip after fewer top-attention
      items are zeroed.
    * ``"input"`` — erase inputs (ERASER): the embeddings are multiplied by (1 − m) or m and the model is
      re-run with its own attention.

    Where gradients flow: (1) through m into the attention distribution and everything that produces it
    (scorer, encoder, embeddings) — set ``detach_mask=True`` to treat the ranking as fixed; (2) in
    ``"attention"`` mode also through the renormalised α itself; (3) through the two erased forward passes
    into every parameter they use (classifier head; in ``"input"`` mode also encoder and embeddings); (4)
    through p(ŷ|x) into the ordinary forward pass unless ``detach_full=True`` (with equal weights the two
    p(ŷ|x) terms cancel). ŷ itself carries no gradient. Rows with fewer than 2 real tokens are skipped.

    Args:
        fraction: share of real tokens in the soft top-k.
        temperature: softness of the mask (on log-attention).
        mode: ``"attention"`` or ``"input"``.
        weight: overall weight.
        comprehensiveness_weight / sufficiency_weight: weights of the two terms.
        detach_mask: stop gradients through the mask.
        detach_full: stop gradients through p(ŷ|x).
        name: the logged name; ``train/<name>_comprehensiveness`` and ``_sufficiency`` are logged too.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> loss = ErasureFaithfulnessLoss(fraction=0.25)(model(batch), batch, model=model)
        >>> loss.shape, -1.0 <= loss.item() <= 1.0
        (torch.Size([]), True)
    """

    def __init__(
        self,
        fraction: float = 0.2,
        temperature: float = 0.1,
        mode: str = "attention",
        weight: float = 1.0,
        comprehensiveness_weight: float = 1.0,
        sufficiency_weight: float = 1.0,
        detach_mask: bool = False,
        detach_full: bool = False,
        name: str = "erasure",
    ) -> None:
        super().__init__()
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction must lie in (0, 1), got {fraction}.")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}.")
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}.")
        self.fraction, self.temperature, self.mode = float(fraction), float(temperature), mode
        self.weight = check_weight(weight, "ErasureFaithfulnessLoss")
        self.comprehensiveness_weight = check_weight(
            comprehensiveness_weight, "ErasureFaithfulnessLoss", "comprehensiveness_weight"
        )
        self.sufficiency_weight = check_weight(sufficiency_weight, "ErasureFaithfulnessLoss", "sufficiency_weight")
        self.detach_mask, self.detach_full = detach_mask, detach_full
        self.name = name
        self.last_terms: Dict[str, Tensor] = {}

    def forward(self, outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
        explained = require_model(model, "ErasureFaithfulnessLoss")  # model: the holder, which logs
        mask = token_mask(outputs, batch, explained)
        attention = outputs.attention
        soft = soft_top_k_mask(attention, mask, self.fraction, self.temperature)
        if self.detach_mask:
            soft = soft.detach()
        probs = outputs.logits.softmax(-1)
        target = probs.detach().argmax(-1, keepdim=True)
        p_full = probs.gather(-1, target).squeeze(-1)
        if self.detach_full:
            p_full = p_full.detach()
        size = attention.shape[0]
        doubled = {
            k: torch.cat([v, v]) if isinstance(v, Tensor) and v.dim() and v.shape[0] == size else v
            for k, v in batch.items()
        }
        embeddings = explained.embed(batch)
        if self.mode == "attention":
            fmask = mask.to(attention.dtype)
            rest = attention * (1.0 - soft) * fmask
            top = attention * soft * fmask
            rest = rest / rest.sum(-1, keepdim=True).clamp_min(1e-12)
            top = top / top.sum(-1, keepdim=True).clamp_min(1e-12)
            erased = explained.forward_from_embeddings(
                torch.cat([embeddings, embeddings]), doubled, attention_override=torch.cat([rest, top])
            )
        else:
            keep = soft.unsqueeze(-1).to(embeddings.dtype)
            erased = explained.forward_from_embeddings(
                torch.cat([embeddings * (1.0 - keep), embeddings * keep]), doubled
            )
        erased_probs = erased.logits.softmax(-1).gather(-1, torch.cat([target, target])).squeeze(-1)
        p_comp, p_suff = erased_probs[:size], erased_probs[size:]
        valid = (mask.sum(-1) >= 2).to(attention.dtype)
        count = valid.sum().clamp_min(1.0)
        comp = ((p_full - p_comp) * valid).sum() / count
        suff = ((p_full - p_suff) * valid).sum() / count
        self.last_terms = {"comprehensiveness": comp.detach(), "sufficiency": suff.detach()}
        for key, value in self.last_terms.items():
            log_extra(model, f"train/{self.name}_{key}", value, size)
        value = self.weight * (self.sufficiency_weight * suff - self.comprehensiveness_weight * comp)
        return self.finite_or_zero(value, model, attention=attention, logits=outputs.logits)

    def extra_repr(self) -> str:
        return f"fraction={self.fraction}, temperature={self.temperature}, mode={self.mode!r}, weight={self.weight}"

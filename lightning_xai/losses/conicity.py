"""Mohankumar et al. (2020): conicity of the hidden states, a penalty for attention that cannot discriminate."""

from __future__ import annotations

from typing import Any

import torch  # noqa: F401 - the docstring examples use it
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.losses._common import FiniteGuard, check_weight, require_finite, token_mask

__all__ = ["ConicityLoss", "conicity"]


def conicity(hidden: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Per-example conicity ``[B]``: mean over real tokens of |cos(h_t, h̄)|, h̄ the mean real hidden state.

    Conicity near 1 means all hidden states point the same way (a narrow cone), so any attention
    distribution pools nearly the same vector. Rows without real tokens give 0.

    Raises:
        ValueError: NaN or infinite hidden states.

    Example:
        >>> h = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [9.0, 9.0]]])
        >>> conicity(h, torch.tensor([[True, True, False]]))  # two orthogonal vectors: cos 45° each
        tensor([0.7071])
    """
    require_finite("conicity", hidden=hidden)
    return _conicity(hidden, mask, eps)


def _conicity(hidden: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    m = mask.to(hidden.dtype).unsqueeze(-1)
    count = m.sum(1).clamp_min(1.0)  # [B, 1]
    mean = (hidden * m).sum(1) / count  # [B, H]
    dot = (hidden * mean.unsqueeze(1)).sum(-1)
    norms = hidden.norm(dim=-1) * mean.norm(dim=-1, keepdim=True)
    cos = dot / norms.clamp_min(eps)
    return (cos.abs() * m.squeeze(-1)).sum(1) / count.squeeze(-1)


class ConicityLoss(FiniteGuard, nn.Module):
    """w · mean_b conicity(h_b) on ``outputs.hidden_states`` over real tokens (Mohankumar et al. use w = 0.5).

    Gradients flow into the encoder (and the embeddings below it) only; the attention scorer is untouched.

    Args:
        weight: w.
        name: the logged name.

    Example:
        >>> import torch
        >>> from lightning_xai.adapters import ExplainOutput
        >>> h = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
        >>> out = ExplainOutput(logits=torch.zeros(1, 2), attention=torch.full((1, 2), 0.5), hidden_states=h)
        >>> ConicityLoss(weight=1.0)(out, {"mask": torch.tensor([[True, True]])})
        tensor(0.7071)
    """

    def __init__(self, weight: float = 0.5, name: str = "conicity") -> None:
        super().__init__()
        self.weight = check_weight(weight, "ConicityLoss")
        self.name = name

    def forward(self, outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
        if outputs.hidden_states is None:
            raise ValueError("ConicityLoss needs outputs.hidden_states [B, T, H]; this model output has none.")
        mask = token_mask(outputs, batch, model)
        if mask.shape != outputs.hidden_states.shape[:2]:
            raise ValueError(
                f"token mask {tuple(mask.shape)} does not match hidden states {tuple(outputs.hidden_states.shape)}."
            )
        value = self.weight * _conicity(outputs.hidden_states, mask).mean()
        return self.finite_or_zero(value, model, hidden_states=outputs.hidden_states)

    def extra_repr(self) -> str:
        return f"weight={self.weight}"

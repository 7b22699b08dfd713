"""Attention scorers: hidden states ``[B, T, H]`` -> scores ``[B, T]``, and the masked softmax over them."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "ATTENTIONS",
    "build_attention",
    "masked_softmax",
    "TanhAttention",
    "DotAttention",
    "LinearAttention",
    "UniformAttention",
]


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over positions where ``mask`` is True; exactly 0 elsewhere.

    Example:
        >>> masked_softmax(torch.zeros(1, 3), torch.tensor([[True, True, False]]))
        tensor([[0.5000, 0.5000, 0.0000]])
    """
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)


class TanhAttention(nn.Module):
    """Jain & Wallace's additive attention: score_t = vᵀ tanh(W h_t + b), W: H -> H/2, v without bias."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_dim, hidden_dim // 2)
        self.v = nn.Linear(hidden_dim // 2, 1, bias=False)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.v(torch.tanh(self.proj(hidden))).squeeze(-1)


class DotAttention(nn.Module):
    """Jain & Wallace's scaled dot attention: score_t = vᵀ h_t / sqrt(H)."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.v = nn.Linear(hidden_dim, 1, bias=False)
        self.scale = 1.0 / math.sqrt(hidden_dim)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.v(hidden).squeeze(-1) * self.scale


class LinearAttention(nn.Module):
    """Pruthi et al.'s BiLSTM scorer: Linear(2H, 1) with bias, no tanh."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()
        self.v = nn.Linear(hidden_dim, 1)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.v(hidden).squeeze(-1)


class UniformAttention(nn.Module):
    """Wiegreffe & Pinter's baseline: equal scores, so α = 1/L over real tokens."""

    def __init__(self, hidden_dim: int) -> None:
        super().__init__()

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden.new_zeros(hidden.shape[:2])


ATTENTIONS = {"tanh": TanhAttention, "dot": DotAttention, "linear": LinearAttention, "uniform": UniformAttention}


def build_attention(name: str, hidden_dim: int) -> nn.Module:
    """Build the scorer called ``name`` (one of :data:`ATTENTIONS`)."""
    if name not in ATTENTIONS:
        raise ValueError(f"Unknown attention {name!r}; choose one of {sorted(ATTENTIONS)}.")
    return ATTENTIONS[name](hidden_dim)

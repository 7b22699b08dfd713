"""Token encoders for the reference models: ``[B, T, E]`` embeddings -> ``[B, T, H]`` hidden states.

Every encoder zeroes pad positions in its output and never lets pads influence real positions
(the LSTMs pack their input), so a model's output is invariant to what sits in the pads.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

__all__ = ["ENCODERS", "build_encoder", "LSTMEncoder", "CNNEncoder", "MLPEncoder"]


class LSTMEncoder(nn.Module):
    """(Bi)LSTM over packed sequences (Jain & Wallace use a BiLSTM with 128 units per direction)."""

    def __init__(self, embedding_dim: int, hidden_dim: int, bidirectional: bool = True) -> None:
        super().__init__()
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, batch_first=True, bidirectional=bidirectional)
        self.output_dim = hidden_dim * (2 if bidirectional else 1)

    def forward(self, embeddings: Tensor, input_mask: Tensor) -> Tensor:
        lengths = input_mask.sum(1).cpu()
        packed = pack_padded_sequence(embeddings, lengths, batch_first=True, enforce_sorted=False)
        output, _ = self.rnn(packed)
        hidden, _ = pad_packed_sequence(output, batch_first=True, total_length=embeddings.shape[1])
        return hidden


class CNNEncoder(nn.Module):
    """Jain & Wallace's CNN: kernels {1, 3, 5, 7}, ReLU, 'same' padding, concatenated channels."""

    def __init__(self, embedding_dim: int, hidden_dim: int, kernel_sizes: tuple = (1, 3, 5, 7)) -> None:
        super().__init__()
        channels = max(1, (2 * hidden_dim) // len(kernel_sizes))
        self.convs = nn.ModuleList(nn.Conv1d(embedding_dim, channels, k, padding=k // 2) for k in kernel_sizes)
        self.output_dim = channels * len(kernel_sizes)

    def forward(self, embeddings: Tensor, input_mask: Tensor) -> Tensor:
        x = (embeddings * input_mask.unsqueeze(-1)).transpose(1, 2)
        hidden = torch.cat([torch.relu(conv(x)) for conv in self.convs], dim=1).transpose(1, 2)
        return hidden * input_mask.unsqueeze(-1)


class MLPEncoder(nn.Module):
    """Wiegreffe & Pinter's context-free diagnostic encoder: each token alone, Linear(E, H) -> tanh."""

    def __init__(self, embedding_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(embedding_dim, hidden_dim)
        self.output_dim = hidden_dim

    def forward(self, embeddings: Tensor, input_mask: Tensor) -> Tensor:
        return torch.tanh(self.proj(embeddings)) * input_mask.unsqueeze(-1)


ENCODERS = {
    "bilstm": lambda e, h: LSTMEncoder(e, h, bidirectional=True),
    "lstm": lambda e, h: LSTMEncoder(e, h, bidirectional=False),
    "cnn": CNNEncoder,
    "mlp": MLPEncoder,
}


def build_encoder(name: str, embedding_dim: int, hidden_dim: int) -> nn.Module:
    """Build the encoder called ``name`` (one of :data:`ENCODERS`)."""
    if name not in ENCODERS:
        raise ValueError(f"Unknown encoder {name!r}; choose one of {sorted(ENCODERS)}.")
    return ENCODERS[name](embedding_dim, hidden_dim)

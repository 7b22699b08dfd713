"""Token encoders for the reference models: ``[B, T, E]`` embeddings -> ``[B, T, H]`` hidden states.

Every encoder zeroes pad positions in its output and never lets pads influence real positions
(the LSTMs pack their input), so a model's output is invariant to what sits in the pads.

The encoders whose first layer is affine in its input offer ``compensate_input_shift(shift)`` (the model's
:class:`~lightning_xai.adapters.capabilities.EmbeddingShift` capability builds on it), and importing this module
registers the LRP rules of :class:`LSTMEncoder` and :class:`MLPEncoder` with
:func:`~lightning_xai.attribution.lrp.register_lrp_encoder`.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Union, cast

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lightning_xai.attribution.lrp import register_lrp_encoder
from lightning_xai.attribution.lrp_rules import lstm_rule, per_token_rule
from lightning_xai.models.lstm_unrolled import supports_unrolling, unrolled_lstm

__all__ = ["ENCODERS", "Encoder", "build_encoder", "LSTMEncoder", "CNNEncoder", "MLPEncoder", "OrthogonalLSTMEncoder"]


def _subtract_shift(weight: Tensor, bias: Optional[Tensor], shift: Tensor, what: str) -> None:
    """``bias ← bias − weight·shift`` in place: the layer then maps ``x + shift`` to what it mapped ``x`` to."""
    if bias is None:
        raise ValueError(f"The {what} has no bias, so a shift of its input cannot be compensated.")
    with torch.no_grad():
        bias.sub_(weight @ shift.to(weight))


class LSTMEncoder(nn.Module):
    """(Bi)LSTM over packed sequences (Jain & Wallace use a BiLSTM with 128 units per direction).

    In eval mode with gradients enabled on CPU — explanation gradients — the same recurrence runs unrolled
    (:func:`~lightning_xai.models.lstm_unrolled.unrolled_lstm`), whose backward skips the full-size zero-fills
    of ``nn.LSTM``'s packed backward (IG on 256 SST-2 sentences: 13.0 s → 10.7 s); training and inference use
    ``nn.LSTM``.
    """

    def __init__(self, embedding_dim: int, hidden_dim: int, bidirectional: bool = True) -> None:
        super().__init__()
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, batch_first=True, bidirectional=bidirectional)
        self.output_dim = hidden_dim * (2 if bidirectional else 1)

    def forward(self, embeddings: Tensor, input_mask: Tensor) -> Tensor:
        if (
            torch.is_grad_enabled()
            and not self.training
            and embeddings.device.type == "cpu"
            and supports_unrolling(self.rnn)
        ):
            # explanation gradients on CPU (eval mode): nn.LSTM's packed backward rewrites the whole packed
            # input once per time step; the unrolled recurrence does not (models/lstm_unrolled.py)
            return unrolled_lstm(self.rnn, embeddings, input_mask.sum(1))
        lengths = input_mask.sum(1).cpu()
        packed = pack_padded_sequence(embeddings, lengths, batch_first=True, enforce_sorted=False)
        output, _ = self.rnn(packed)
        hidden, _ = pad_packed_sequence(output, batch_first=True, total_length=embeddings.shape[1])
        return hidden

    def compensate_input_shift(self, shift: Tensor) -> None:
        """Absorb a constant shift of every input vector into the input biases of both directions."""
        for suffix in ("", "_reverse") if self.rnn.bidirectional else ("",):
            _subtract_shift(
                getattr(self.rnn, f"weight_ih_l0{suffix}"), getattr(self.rnn, f"bias_ih_l0{suffix}"), shift, "LSTM"
            )


class OrthogonalLSTMEncoder(nn.Module):
    """Mohankumar et al.'s orthogonal (Bi)LSTM: each new hidden state is made orthogonal to the running mean
    of the earlier ones, h_t <- h_t - (<h_t, m>/(<m, m> + 1e-6)) m, and the orthogonalised h_t is carried to
    the next step. This lowers conicity, so different attention distributions pool different vectors.

    A step-by-step ``LSTMCell`` loop (slower than cuDNN); pads neither update the state nor the running mean,
    and the backward direction reads each row's real prefix reversed.
    """

    def __init__(self, embedding_dim: int, hidden_dim: int, bidirectional: bool = True) -> None:
        super().__init__()
        self.cells = nn.ModuleList(nn.LSTMCell(embedding_dim, hidden_dim) for _ in range(2 if bidirectional else 1))
        self.hidden_dim = hidden_dim
        self.output_dim = hidden_dim * len(self.cells)

    def _lstm_cells(self) -> List[nn.LSTMCell]:
        """``self.cells``, which holds ``nn.LSTMCell`` s (``nn.ModuleList`` types its items as ``nn.Module``)."""
        return [cast(nn.LSTMCell, cell) for cell in self.cells]

    def _run(self, cell: nn.LSTMCell, inputs: Tensor, mask: Tensor) -> Tensor:
        batch, steps, _ = inputs.shape
        h = inputs.new_zeros(batch, self.hidden_dim)
        c = inputs.new_zeros(batch, self.hidden_dim)
        total = inputs.new_zeros(batch, self.hidden_dim)
        count = inputs.new_zeros(batch, 1)
        outputs = []
        for t in range(steps):
            h_new, c_new = cell(inputs[:, t], (h, c))
            mean = total / count.clamp_min(1.0)
            h_new = h_new - ((h_new * mean).sum(-1, keepdim=True) / ((mean * mean).sum(-1, keepdim=True) + 1e-6)) * mean
            step = mask[:, t].unsqueeze(-1)
            h = torch.where(step, h_new, h)
            c = torch.where(step, c_new, c)
            live = h_new * step
            total = total + live
            count = count + step.to(inputs.dtype)
            outputs.append(live)
        return torch.stack(outputs, dim=1)

    def forward(self, embeddings: Tensor, input_mask: Tensor) -> Tensor:
        mask = input_mask.bool()
        cells = self._lstm_cells()
        outputs = [self._run(cells[0], embeddings, mask)]
        if len(cells) == 2:
            lengths = mask.sum(1, keepdim=True)
            positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
            reverse = torch.where(positions < lengths, lengths - 1 - positions, positions)  # an involution
            index = reverse.unsqueeze(-1)
            flipped = embeddings.gather(1, index.expand(-1, -1, embeddings.shape[-1]))
            backward = self._run(cells[1], flipped, mask)
            outputs.append(backward.gather(1, index.expand(-1, -1, backward.shape[-1])))
        return torch.cat(outputs, dim=-1)

    def compensate_input_shift(self, shift: Tensor) -> None:
        """Absorb a constant shift of every input vector into the input bias of each direction's cell."""
        for cell in self._lstm_cells():
            _subtract_shift(cell.weight_ih, cell.bias_ih, shift, "LSTM cell")


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

    def compensate_input_shift(self, shift: Tensor) -> None:
        """Absorb a constant shift of every input vector into the projection's bias."""
        _subtract_shift(self.proj.weight, self.proj.bias, shift, "MLP encoder")


#: the encoders of :data:`ENCODERS`: each maps ``(embeddings, input_mask)`` to ``[B, T, output_dim]``
Encoder = Union[LSTMEncoder, OrthogonalLSTMEncoder, CNNEncoder, MLPEncoder]

ENCODERS: Dict[str, Callable[[int, int], Encoder]] = {
    "bilstm": lambda e, h: LSTMEncoder(e, h, bidirectional=True),
    "lstm": lambda e, h: LSTMEncoder(e, h, bidirectional=False),
    "cnn": CNNEncoder,
    "mlp": MLPEncoder,
    "ortho_bilstm": lambda e, h: OrthogonalLSTMEncoder(e, h, bidirectional=True),
    "ortho_lstm": lambda e, h: OrthogonalLSTMEncoder(e, h, bidirectional=False),
}


def build_encoder(name: str, embedding_dim: int, hidden_dim: int) -> Encoder:
    """Build the encoder called ``name`` (one of :data:`ENCODERS`)."""
    if name not in ENCODERS:
        raise ValueError(f"Unknown encoder {name!r}; choose one of {sorted(ENCODERS)}.")
    return ENCODERS[name](embedding_dim, hidden_dim)


# LRP (lightning_xai.attribution.lrp) finds a rule by the encoder's type; the models register theirs here
register_lrp_encoder(LSTMEncoder)(lstm_rule)
register_lrp_encoder(MLPEncoder)(per_token_rule)

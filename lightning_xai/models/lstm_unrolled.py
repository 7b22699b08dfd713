"""The reference (Bi)LSTM written out step by step, for two explanation workloads that ``nn.LSTM`` over packed
sequences serves slowly on CPU. Both give ``nn.LSTM``'s results up to float rounding
(tests/models/test_lstm_unrolled.py checks them against it).

**Scoring one-token deletions** (:func:`lstm_states`, :func:`deletion_reruns`, :func:`deleted_hidden`).
Deleting token i changes nothing before it in the forward direction and nothing after it in the backward
direction. So the variant "row b without position i" needs only (1) the forward recurrence over positions
i+1 … L−1, started from the full row's forward state at i−1, and (2) the backward recurrence over positions
i−1 … 0, started from the full row's backward state at i+1 — one direction's worth of steps instead of two.
The input projections W_ih·x + b of every token are computed once per row, not once per variant, so each step
costs only the recurrent product W_hh·h. Leave-one-out on the reference BiLSTM (Σ L variants of length L − 1)
does about a sixth of the LSTM multiply-adds of re-running the network on every variant (0.85 s → 0.43 s on 256
SST-2 sentences; the attention and classifier still run on every variant).

**Gradients w.r.t. the inputs** (:func:`unrolled_lstm`). Backpropagating through ``nn.LSTM`` on a packed
sequence, PyTorch's CPU kernel slices the packed input once per time step, and the backward of every slice
writes a zero tensor the size of the whole packed input: O(T · ΣL · E) memory traffic. The unrolled recurrence
projects all inputs in one matrix product and reads per-step views of it, so its backward allocates per-step
gradients of one step's size (on 256 SST-2 sentences a gradient call goes from 0.24 s to 0.21 s, 50-step IG
from 13.0 s to 10.7 s).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = [
    "DeletionReruns",
    "LSTMStates",
    "deleted_hidden",
    "deletion_reruns",
    "lstm_states",
    "supports_unrolling",
    "unrolled_lstm",
]


class LSTMStates(NamedTuple):
    """The full rows' recurrent states, per direction (forward first): what every deletion variant reuses.

    Attributes:
        projected: per direction ``[B·T, 4H]``: W_ih·x_t + b_ih + b_hh of every position (row-major).
        hidden: per direction ``[B, T, H]``: h_t at every position (zeros past the row's length).
        cell: per direction ``[B, T, H]``: c_t likewise.
        lengths: ``[B]`` input lengths (the rows are left-aligned, as ``pack_padded_sequence`` reads them).
    """

    projected: Tuple[Tensor, ...]
    hidden: Tuple[Tensor, ...]
    cell: Tuple[Tensor, ...]
    lengths: Tensor


def supports_unrolling(rnn: nn.Module) -> bool:
    """Whether the functions of this module reproduce ``rnn``: a one-layer, batch-first
    ``nn.LSTM`` with biases and without projections."""
    return isinstance(rnn, nn.LSTM) and rnn.num_layers == 1 and rnn.batch_first and rnn.bias and rnn.proj_size == 0


def _direction_weights(rnn: nn.LSTM, direction: int) -> Tuple[Tensor, Tensor, Tensor]:
    suffix = "_reverse" if direction else ""
    bias = getattr(rnn, f"bias_ih_l0{suffix}") + getattr(rnn, f"bias_hh_l0{suffix}")
    return getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}"), bias


def _recur(
    projected: Tensor,
    start: Tensor,
    step: int,
    lengths: Tensor,
    h0: Tensor,
    c0: Tensor,
    w_hh: Tensor,
    out_h: Tensor,
    out_c: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Run one LSTM direction over N sequences given their projected inputs, writing h (and c) packed.

    Sequence k reads rows ``start[k] + step·s`` of ``projected`` for s < ``lengths[k]``, from state
    ``(h0[k], c0[k])``. The sequences run longest first, so the ones still running at step s are a prefix of
    the batch, and their outputs go to the consecutive rows ``offsets[s] … offsets[s] + running_s − 1`` of
    ``out_h`` (``[Σ lengths, H]``, the layout of a ``PackedSequence``). Returns ``(offsets [S], slot [N])``:
    the h of sequence k at step s is row ``offsets[s] + slot[k]``.
    """
    N, H = start.numel(), w_hh.shape[1]
    order = torch.argsort(lengths, descending=True, stable=True)
    slot = torch.empty_like(order)
    slot[order] = torch.arange(N, device=order.device)
    steps = int(lengths.max()) if N else 0
    running = (lengths.unsqueeze(0) > torch.arange(steps, device=lengths.device).unsqueeze(1)).sum(1)
    offsets = torch.cumsum(running, 0) - running
    start, h, c = start[order], h0[order], c0[order]
    w = w_hh.t()
    for s, (n, at) in enumerate(zip(running.tolist(), offsets.tolist())):
        gates = torch.addmm(projected.index_select(0, start[:n] + step * s), h[:n], w)
        gate = gates.sigmoid()  # i, f, (g), o; g is the tanh slice
        c = gate[:, H : 2 * H] * c[:n] + gate[:, :H] * gates[:, 2 * H : 3 * H].tanh()
        h = torch.mul(gate[:, 3 * H :], c.tanh(), out=out_h[at : at + n])
        if out_c is not None:
            out_c[at : at + n] = c
    return offsets, slot


def unrolled_lstm(rnn: nn.LSTM, embeddings: Tensor, lengths: Tensor) -> Tensor:
    """``[B, T, D·H]``: ``rnn`` over the left-aligned rows of ``embeddings`` (zeros past each length), as
    ``LSTMEncoder`` returns it, differentiable, with a cheap backward on CPU (see the module docstring).

    Args:
        rnn: a module :func:`supports_unrolling` accepts.
        embeddings: ``[B, T, E]``.
        lengths: ``[B]`` number of leading positions read in each row (≥ 1).

    Example:
        >>> rnn = nn.LSTM(4, 3, batch_first=True, bidirectional=True)
        >>> x = torch.randn(2, 5, 4)
        >>> out = unrolled_lstm(rnn, x, torch.tensor([5, 5]))
        >>> bool(torch.allclose(out, rnn(x)[0], atol=1e-6))
        True
    """
    B, T, E = embeddings.shape
    lengths = lengths.to(device=embeddings.device, dtype=torch.long)
    order = torch.argsort(lengths, descending=True, stable=True)  # running rows are a prefix at every step
    slot = torch.empty_like(order)
    slot[order] = torch.arange(B, device=order.device)
    x, lengths = embeddings.index_select(0, order), lengths.index_select(0, order)
    steps = int(lengths[0]) if B else 0
    position = torch.arange(T, device=x.device).unsqueeze(0)
    running: List[int] = (lengths.unsqueeze(0) > position[:, :steps].t()).sum(1).tolist()
    # the backward direction reads each row's prefix reversed: position p <-> L − 1 − p (an involution)
    reverse = torch.where(position < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - position, position)
    outputs = []
    for direction in range(2 if rnn.bidirectional else 1):
        w_ih, w_hh, bias = _direction_weights(rnn, direction)
        projected = torch.addmm(bias, x.reshape(B * T, E), w_ih.t()).view(B, T, -1)
        if direction == 1:
            projected = projected.gather(1, reverse.unsqueeze(-1).expand_as(projected))
        H = w_hh.shape[1]
        h = c = x.new_zeros(B, H)
        hs = []
        for step, n in zip(projected[:, :steps].unbind(1), running):
            gates = torch.addmm(step[:n], h[:n], w_hh.t())
            gate = gates.sigmoid()
            c = gate[:, H : 2 * H] * c[:n] + gate[:, :H] * gates[:, 2 * H : 3 * H].tanh()
            h = gate[:, 3 * H :] * c.tanh()
            hs.append(nn.functional.pad(h, (0, 0, 0, B - n)))
        out = torch.stack(hs, 1) if hs else x.new_zeros(B, 0, H)
        out = nn.functional.pad(out, (0, 0, 0, T - steps))
        if direction == 1:
            out = out.gather(1, reverse.unsqueeze(-1).expand_as(out))
        outputs.append(out)
    return torch.cat(outputs, dim=-1).index_select(0, slot)


@torch.no_grad()
def lstm_states(rnn: nn.LSTM, embeddings: Tensor, lengths: Tensor) -> LSTMStates:
    """Projected inputs and every position's (h, c) of ``rnn`` over the left-aligned rows of ``embeddings``
    (inference only: no autograd graph).

    Args:
        rnn: a module :func:`supports_unrolling` accepts.
        embeddings: ``[B, T, E]``.
        lengths: ``[B]`` number of leading positions the LSTM reads in each row (≥ 1).

    Example:
        >>> rnn = nn.LSTM(4, 3, batch_first=True, bidirectional=True)
        >>> states = lstm_states(rnn, torch.randn(2, 5, 4), torch.tensor([5, 2]))
        >>> [tuple(h.shape) for h in states.hidden]
        [(2, 5, 3), (2, 5, 3)]
    """
    B, T, _ = embeddings.shape
    H = rnn.hidden_size
    lengths = lengths.to(device=embeddings.device, dtype=torch.long)
    rows = torch.arange(B, device=embeddings.device) * T
    zeros = embeddings.new_zeros(B, H)
    position = torch.arange(T, device=embeddings.device).unsqueeze(0)
    live = position < lengths.unsqueeze(1)
    total = int(lengths.sum())
    projected, hidden, cell = [], [], []
    for direction in range(2 if rnn.bidirectional else 1):
        w_ih, w_hh, bias = _direction_weights(rnn, direction)
        proj = torch.addmm(bias, embeddings.reshape(B * T, -1), w_ih.t())
        packed_h, packed_c = embeddings.new_zeros(total + 1, H), embeddings.new_zeros(total + 1, H)  # + a zero row
        if direction == 0:  # step s is position s
            offsets, slot = _recur(proj, rows, 1, lengths, zeros, zeros, w_hh, packed_h, packed_c)
            step = position.expand(B, T)
        else:  # step s of the backward run is position L − 1 − s
            offsets, slot = _recur(proj, rows + lengths - 1, -1, lengths, zeros, zeros, w_hh, packed_h, packed_c)
            step = lengths.unsqueeze(1) - 1 - position
        index = offsets.index_select(0, step.clamp(0, offsets.numel() - 1).flatten()).view(B, T) + slot.unsqueeze(1)
        index = index.masked_fill(~live, total).flatten()
        projected.append(proj)
        hidden.append(packed_h.index_select(0, index).view(B, T, H))
        cell.append(packed_c.index_select(0, index).view(B, T, H))
    return LSTMStates(tuple(projected), tuple(hidden), tuple(cell), lengths)


class DeletionReruns(NamedTuple):
    """The recurrences that one-token deletions rerun; see :func:`deletion_reruns`.

    Attributes:
        source: ``[D·(B·T) + R + 1, H]`` rows: per direction (forward first) the full rows' states (row-major)
            and that direction's rerun outputs packed; a zero row last.
        base: per direction, the row of ``source`` where its full rows' states start.
        offsets: per direction ``[S]``: the row of ``source`` where step s of its reruns starts.
        slot: per direction ``[N]``: rerun k's output at step s is row ``offsets[s] + slot[k]``.
    """

    source: Tensor
    base: Tuple[int, ...]
    offsets: Tuple[Tensor, ...]
    slot: Tuple[Tensor, ...]


def _state_at(states: Tensor, rows: Tensor, positions: Tensor, valid: Tensor) -> Tensor:
    """``states[rows, positions]`` ([B, T, H] → [N, H]), zeros where ``valid`` is False (no earlier state)."""
    B, T, H = states.shape
    flat = states.reshape(B * T, H).index_select(0, (rows * T + positions).clamp(0, B * T - 1))
    return flat * valid.unsqueeze(-1)


@torch.no_grad()
def deletion_reruns(rnn: nn.LSTM, states: LSTMStates, rows: Tensor, positions: Tensor) -> DeletionReruns:
    """Run (inference only), for every variant "row ``rows[k]`` without position ``positions[k]``", the forward
    recurrence over the positions after the deleted one and the backward recurrence over those before it, from
    the full row's states next to it — all variants together, one step at a time (see the module docstring)."""
    B, T, H = states.hidden[0].shape
    length = states.lengths.index_select(0, rows)
    plans = []
    for direction in range(len(states.hidden)):
        if direction == 0:  # positions i+1 … L−1, from the state at i − 1
            plans.append((positions > 0, length - 1 - positions, rows * T + positions + 1, 1, positions - 1))
        else:  # positions i−1 … 0, from the state at i + 1
            plans.append((positions + 1 < length, positions, rows * T + positions - 1, -1, positions + 1))
    totals = [int(plan[1].sum()) for plan in plans]
    # one buffer for both directions, so that deleted_hidden assembles [n, width, D·H] in a single gather
    source = states.hidden[0].new_empty(len(plans) * B * T + sum(totals) + 1, H)
    source[-1] = 0.0
    base, offsets, slots, at = [], [], [], 0
    for direction, ((valid, steps, start, step, neighbour), total) in enumerate(zip(plans, totals)):
        _, w_hh, _ = _direction_weights(rnn, direction)
        hidden, cell, proj = states.hidden[direction], states.cell[direction], states.projected[direction]
        h0, c0 = (_state_at(s, rows, neighbour, valid) for s in (hidden, cell))
        source[at : at + B * T] = hidden.reshape(B * T, H)
        base.append(at)
        at += B * T
        offset, slot = _recur(proj, start, step, steps, h0, c0, w_hh, source[at : at + total])
        offsets.append(offset + at)
        slots.append(slot)
        at += total
    return DeletionReruns(source, tuple(base), tuple(offsets), tuple(slots))


def deleted_hidden(
    states: LSTMStates,
    reruns: DeletionReruns,
    rows: Tensor,
    positions: Tensor,
    variants: Optional[Tensor] = None,
    width: Optional[int] = None,
) -> Tensor:
    """``[n, width, D·H]``: the LSTM's outputs for row ``rows[k]`` without position ``positions[k]``, for the
    variants k in ``variants`` (default: all).

    Equal, up to float rounding, to the LSTM run (packed) on the shortened row: outputs of the L − 1 remaining
    positions, zeros after them — the layout ``LSTMEncoder`` returns.

    Args:
        states: :func:`lstm_states` of the full rows.
        reruns: :func:`deletion_reruns` of all the variants.
        rows: ``[N]`` row of each variant.
        positions: ``[N]`` deleted position of each variant, inside its row's length.
        variants: indices of the variants to assemble (to bound memory, assemble a few at a time).
        width: positions to return (default T − 1; at least the longest variant's L − 1).

    Example:
        >>> rnn = nn.LSTM(4, 3, batch_first=True, bidirectional=True)
        >>> x = torch.randn(1, 4, 4)
        >>> states = lstm_states(rnn, x, torch.tensor([4]))
        >>> rows, positions = torch.tensor([0, 0]), torch.tensor([1, 3])
        >>> fast = deleted_hidden(states, deletion_reruns(rnn, states, rows, positions), rows, positions)
        >>> slow, _ = rnn(x[:, [0, 2, 3]])
        >>> bool(torch.allclose(fast[0], slow[0], atol=1e-6))
        True
    """
    B, T, H = states.hidden[0].shape
    width = T - 1 if width is None else width
    pick = (lambda t: t) if variants is None else (lambda t: t.index_select(0, variants))
    rows, positions = pick(rows), pick(positions)
    n = rows.numel()
    length = states.lengths.index_select(0, rows)
    j = torch.arange(width, device=rows.device).unsqueeze(0)
    i = positions.unsqueeze(1)
    before = j < i  # new position j holds old position j before the deleted one, old j + 1 from it on
    past_end = j >= (length - 1).unsqueeze(1)
    indices = []
    for direction, (base, offsets, slot) in enumerate(zip(reruns.base, reruns.offsets, reruns.slot)):
        if direction == 0:
            reused, old, step = before, base + rows.unsqueeze(1) * T + j, j - i
        else:
            reused, old, step = ~before, base + rows.unsqueeze(1) * T + j + 1, i - 1 - j
        if offsets.numel():
            rerun = offsets.index_select(0, step.clamp(0, offsets.numel() - 1).flatten()).view(n, width)
            rerun = rerun + pick(slot).unsqueeze(1)
        else:  # no variant reruns anything in this direction
            rerun = old
        indices.append(torch.where(reused, old, rerun).masked_fill(past_end, reruns.source.shape[0] - 1))
    # one gather from [old states; rerun outputs; a zero row]: row (k, j, direction) of [n, width, D, H]
    index = torch.stack(indices, dim=-1).flatten()
    return reruns.source.index_select(0, index).view(n, width, len(indices) * H)

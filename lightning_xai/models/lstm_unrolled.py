"""The reference (Bi)LSTM written out step by step, for two explanation workloads that ``nn.LSTM`` over packed
sequences serves slowly on CPU. Both give ``nn.LSTM``'s results up to float rounding
(tests/models/test_lstm_unrolled.py checks them against it).

**Scoring one-token deletions** (:func:`lstm_states`, :func:`deleted_hidden`). Deleting token i changes nothing
before it in the forward direction and nothing after it in the backward direction. So the variant "row b
without position i" needs only (1) the forward recurrence over positions i+1 … L−1, started from the full row's
forward state at i−1, and (2) the backward recurrence over positions i−1 … 0, started from the full row's
backward state at i+1 — one direction's worth of steps instead of two. The input projections W_ih·x + b of
every token are computed once per row, not once per variant, so each step costs only the recurrent product
W_hh·h. Leave-one-out on the reference BiLSTM (Σ L variants of length L − 1) does about a sixth of the
multiply-adds of re-running the network on every variant.

**Gradients w.r.t. the inputs** (:func:`unrolled_lstm`). Backpropagating through ``nn.LSTM`` on a packed
sequence, PyTorch's CPU kernel slices the packed input once per time step, and the backward of every slice
writes a zero tensor the size of the whole packed input: O(T · ΣL · E) memory traffic, 40% of a gradient call
on the reference model. The unrolled recurrence projects all inputs in one matrix product and reads per-step
views of it, so its backward allocates per-step gradients of one step's size.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = ["LSTMStates", "deleted_hidden", "lstm_states", "supports_unrolling", "unrolled_lstm"]


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
    return (isinstance(rnn, nn.LSTM) and rnn.num_layers == 1 and rnn.batch_first and rnn.bias
            and rnn.proj_size == 0)


def _direction_weights(rnn: nn.LSTM, direction: int) -> Tuple[Tensor, Tensor, Tensor]:
    suffix = "_reverse" if direction else ""
    bias = getattr(rnn, f"bias_ih_l0{suffix}") + getattr(rnn, f"bias_hh_l0{suffix}")
    return getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}"), bias


def _recur(projected: Tensor, start: Tensor, step: int, lengths: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor,
           keep_cell: bool, out: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor], Tensor]:
    """Run one LSTM direction over N sequences given their projected inputs.

    Sequence k reads rows ``start[k] + step·s`` of ``projected`` for s < ``lengths[k]``, from state
    ``(h0[k], c0[k])``. The sequences run longest first, so the ones still running at step s are a prefix of
    the batch. Returns h (and c if ``keep_cell``) of every step in that order, ``[N, S, H]``, zeros past each
    length, and ``slot`` ``[N]``: the row of sequence k in them. With ``out`` (``[N, S, H]``) h is written there
    and entries past each length are left as they are.
    """
    N, H = start.numel(), w_hh.shape[1]
    steps = int(lengths.max()) if N else 0
    hs = projected.new_zeros(N, steps, H) if out is None else out
    cs = projected.new_zeros(N, steps, H) if keep_cell else None
    order = torch.argsort(lengths, descending=True, stable=True)
    slot = torch.empty_like(order)
    slot[order] = torch.arange(N, device=order.device)
    if steps == 0:
        return hs, cs, slot
    step_index = torch.arange(steps, device=lengths.device).unsqueeze(1)
    running: List[int] = (lengths.unsqueeze(0) > step_index).sum(1).tolist()
    start, h, c = start[order], h0[order], c0[order]
    w = w_hh.t()
    for s in range(steps):
        n = running[s]
        gates = torch.addmm(projected.index_select(0, start[:n] + step * s), h[:n], w)
        gate = gates.sigmoid()  # i, f, (g), o; g is the tanh slice
        c = gate[:, H:2 * H] * c[:n] + gate[:, :H] * gates[:, 2 * H:3 * H].tanh()
        h = gate[:, 3 * H:] * c.tanh()
        hs[:n, s] = h
        if cs is not None:
            cs[:n, s] = c
    return hs, cs, slot


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
            c = gate[:, H:2 * H] * c[:n] + gate[:, :H] * gates[:, 2 * H:3 * H].tanh()
            h = gate[:, 3 * H:] * c.tanh()
            hs.append(nn.functional.pad(h, (0, 0, 0, B - n)))
        out = torch.stack(hs, 1) if hs else x.new_zeros(B, 0, H)
        out = nn.functional.pad(out, (0, 0, 0, T - steps))
        if direction == 1:
            out = out.gather(1, reverse.unsqueeze(-1).expand_as(out))
        outputs.append(out)
    return torch.cat(outputs, dim=-1).index_select(0, slot)


def lstm_states(rnn: nn.LSTM, embeddings: Tensor, lengths: Tensor) -> LSTMStates:
    """Projected inputs and every position's (h, c) of ``rnn`` over the left-aligned rows of ``embeddings``.

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
    lengths = lengths.to(device=embeddings.device, dtype=torch.long)
    rows = torch.arange(B, device=embeddings.device) * T
    zeros = embeddings.new_zeros(B, rnn.hidden_size)
    projected, hidden, cell = [], [], []
    for direction in range(2 if rnn.bidirectional else 1):
        w_ih, w_hh, bias = _direction_weights(rnn, direction)
        proj = torch.addmm(bias, embeddings.reshape(B * T, -1), w_ih.t())
        if direction == 0:
            h, c, slot = _recur(proj, rows, 1, lengths, zeros, zeros, w_hh, keep_cell=True)
            h, c = h.index_select(0, slot), c.index_select(0, slot)
        else:  # step s of the backward run is position L − 1 − s
            h, c, slot = _recur(proj, rows + lengths - 1, -1, lengths, zeros, zeros, w_hh, keep_cell=True)
            h, c = h.index_select(0, slot), c.index_select(0, slot)
            position = torch.arange(h.shape[1], device=h.device)
            index = (lengths.unsqueeze(1) - 1 - position).clamp(min=0).unsqueeze(-1).expand_as(h)
            live = (position < lengths.unsqueeze(1)).unsqueeze(-1)
            h, c = h.gather(1, index) * live, c.gather(1, index) * live
        pad = T - h.shape[1]  # rows shorter than T everywhere: zero states at the trailing positions
        projected.append(proj)
        hidden.append(nn.functional.pad(h, (0, 0, 0, pad)))
        cell.append(nn.functional.pad(c, (0, 0, 0, pad)))
    return LSTMStates(tuple(projected), tuple(hidden), tuple(cell), lengths)


def _state_at(states: Tensor, rows: Tensor, positions: Tensor, valid: Tensor) -> Tensor:
    """``states[rows, positions]`` ([B, T, H] → [N, H]), zeros where ``valid`` is False (no earlier state)."""
    B, T, H = states.shape
    flat = states.reshape(B * T, H).index_select(0, (rows * T + positions).clamp(0, B * T - 1))
    return flat * valid.unsqueeze(-1)


def _source(hidden: Tensor, variants: int, steps: Tensor) -> Tuple[Tensor, Tensor]:
    """``[B·T + N·S + 1, H]`` rows: the full rows' states, room for N reruns of S steps, a zero row; and the
    ``[N, S, H]`` view of the room (the rerun writes there directly, no copy)."""
    B, T, H = hidden.shape
    S = int(steps.max()) if variants else 0
    source = hidden.new_empty(B * T + variants * S + 1, H)
    source[:B * T] = hidden.reshape(B * T, H)
    source[-1] = 0.0
    return source, source[B * T:B * T + variants * S].view(variants, S, H)


def deleted_hidden(rnn: nn.LSTM, states: LSTMStates, rows: Tensor, positions: Tensor,
                   width: Optional[int] = None) -> Tensor:
    """``[N, width, D·H]``: the LSTM's outputs for row ``rows[k]`` without position ``positions[k]``.

    Equal, up to float rounding, to ``rnn`` run (packed) on the shortened row: outputs of the L − 1 remaining
    positions, zeros after them — the layout ``LSTMEncoder`` returns.

    Args:
        rnn: the module ``states`` was computed with.
        states: :func:`lstm_states` of the full rows.
        rows: ``[N]`` row of each variant.
        positions: ``[N]`` deleted position of each variant, inside its row's length.
        width: positions to return (default T − 1; at least the longest variant, L − 1).

    Example:
        >>> rnn = nn.LSTM(4, 3, batch_first=True, bidirectional=True)
        >>> x = torch.randn(1, 4, 4)
        >>> states = lstm_states(rnn, x, torch.tensor([4]))
        >>> fast = deleted_hidden(rnn, states, torch.tensor([0]), torch.tensor([1]))
        >>> slow, _ = rnn(x[:, [0, 2, 3]])
        >>> bool(torch.allclose(fast, slow, atol=1e-6))
        True
    """
    B, T, H = states.hidden[0].shape
    width = T - 1 if width is None else width
    N = rows.numel()
    length = states.lengths.index_select(0, rows)
    j = torch.arange(width, device=rows.device).unsqueeze(0)
    i = positions.unsqueeze(1)
    before = j < i  # new position j holds old position j before the deleted one, old j + 1 from it on
    outputs = []
    for direction in range(len(states.hidden)):
        _, w_hh, _ = _direction_weights(rnn, direction)
        hidden, cell, proj = states.hidden[direction], states.cell[direction], states.projected[direction]
        if direction == 0:  # forward: old states before i, a rerun over i+1 … L−1 from the state at i − 1
            valid = positions > 0
            h0, c0 = (_state_at(s, rows, positions - 1, valid) for s in (hidden, cell))
            steps = length - 1 - positions
            source, rerun = _source(hidden, N, steps)
            _, _, slot = _recur(proj, rows * T + positions + 1, 1, steps, h0, c0, w_hh, False, out=rerun)
            old, step = rows.unsqueeze(1) * T + j, j - i
        else:  # backward: a rerun over i−1 … 0 from the state at i + 1, old states after i
            valid = positions + 1 < length
            h0, c0 = (_state_at(s, rows, positions + 1, valid) for s in (hidden, cell))
            source, rerun = _source(hidden, N, positions)
            _, _, slot = _recur(proj, rows * T + positions - 1, -1, positions, h0, c0, w_hh, False, out=rerun)
            old, step = rows.unsqueeze(1) * T + j + 1, i - 1 - j
        reused = before if direction == 0 else ~before
        S = rerun.shape[1]
        # one gather from [old states; rerun outputs; a zero row] builds this direction's [N, width, H]
        index = torch.where(reused, old, B * T + slot.unsqueeze(1) * S + step.clamp(0, max(S - 1, 0)))
        index = index.masked_fill(j >= (length - 1).unsqueeze(1), B * T + N * S)  # past the shortened row
        outputs.append(source.index_select(0, index.flatten()).view(N, width, H))
    return torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]

"""The LRP rules themselves (Arras et al. 2017): the ε-rule of a linear layer and the encoder rules.

:func:`lrp_linear` is the ε-rule every other rule is built from; :func:`lstm_rule` propagates through a
single-layer (bi)LSTM held in ``encoder.rnn`` (re-run in Python by :func:`lstm_forward`), :func:`per_token_rule`
through a per-token ``act(encoder.proj(x_t))``. They know ``nn.LSTM`` and ``nn.Linear``, no model class: the
models package registers them for its encoders with :func:`~lightning_xai.attribution.lrp.register_lrp_encoder`.
The rules are described in :mod:`lightning_xai.attribution.lrp`.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = ["lrp_linear", "lstm_forward", "lstm_rule", "per_token_rule"]


def _sign(z: Tensor) -> Tensor:
    return torch.where(z >= 0, torch.ones_like(z), -torch.ones_like(z))


def _safe_div(numer: Tensor, denom: Tensor) -> Tensor:
    return numer / torch.where(denom == 0, torch.ones_like(denom), denom) * (denom != 0)


def lrp_linear(
    inputs: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    output: Tensor,
    relevance: Tensor,
    *,
    eps: float = 1e-3,
    bias_factor: float = 0.0,
    present: Optional[Tensor] = None,
) -> Tensor:
    """LRP-ε through ``output = inputs @ weight.T + bias`` (Arras et al.'s ``lrp_linear``).

    ``R_j = x_j Σ_i w_ij s_i + (β / N) Σ_i (b_i + ε sign(z_i)) s_i`` with ``s_i = R_i / (z_i + ε sign(z_i))``.

    Args:
        inputs: ``[..., N]`` layer inputs ``x``.
        weight: ``[M, N]``.
        bias: ``[M]`` or ``None``.
        output: ``[..., M]`` the pre-activations ``z`` (bias included).
        relevance: ``[..., M]`` relevance of the outputs.
        eps: the stabiliser ε (0 gives LRP-0; a zero denominator then passes no relevance).
        bias_factor: β: 0 lets bias and ε absorb their share; 1 spreads it over the inputs (exact conservation).
        present: ``[..., N]`` bool, inputs that exist (the others get nothing, not even a bias share).

    Returns:
        ``[..., N]`` relevance of the inputs.

    Example:
        >>> x, w = torch.tensor([1.0, 2.0]), torch.tensor([[1.0, -1.0]])
        >>> z = x @ w.T
        >>> lrp_linear(x, w, None, z, z, eps=0.0)
        tensor([ 1., -2.])
    """
    denom = output + eps * _sign(output)
    scaled = _safe_div(relevance, denom)
    result = inputs * (scaled @ weight)
    if bias_factor:
        total_bias = output.new_zeros(()) if bias is None else bias
        share = ((total_bias + eps * _sign(output)) * scaled).sum(-1, keepdim=True)
        if present is None:
            result = result + bias_factor * share / inputs.shape[-1]
        else:
            count = present.sum(-1, keepdim=True).clamp_min(1).to(inputs.dtype)
            result = result + bias_factor * share / count * present
    return result


# --- the LSTM, re-run in Python --------------------------------------------------------------------------
def lstm_forward(
    x: Tensor,
    lengths: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Optional[Tensor],
    bias_hh: Optional[Tensor],
    *,
    reverse: bool = False,
) -> Dict[str, Tensor]:
    """One direction of a single-layer ``nn.LSTM`` over right-padded sequences, keeping every intermediate.

    Matches ``nn.LSTM`` on a packed sequence: position ``t`` of row ``b`` is processed iff ``t < lengths[b]``;
    the reverse direction starts from a zero state at ``lengths[b] - 1``; outputs are 0 at pads.

    Returns:
        dict of ``[B, T, ·]`` tensors: ``h``, ``c``, ``c_prev``, ``h_prev``, gates ``i``, ``f``, ``g``, ``o``,
        ``g_pre`` (the cell candidate's pre-activation) and bool ``first`` ``[B, T]`` (no previous state).

    Example:
        >>> lstm = nn.LSTM(3, 2, batch_first=True)
        >>> x = torch.randn(1, 4, 3)
        >>> out = lstm_forward(x, torch.tensor([4]), lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0,
        ...                    lstm.bias_hh_l0)
        >>> torch.allclose(out["h"], lstm(x)[0], atol=1e-6)
        True
    """
    batch, steps, _ = x.shape
    hidden = weight_hh.shape[1]
    valid = torch.arange(steps, device=x.device).unsqueeze(0) < lengths.to(x.device).unsqueeze(1)
    bias: Union[float, Tensor] = 0.0
    if bias_ih is not None:
        bias = bias + bias_ih
    if bias_hh is not None:
        bias = bias + bias_hh
    pre_x = x @ weight_ih.T + bias  # [B, T, 4H], all steps at once
    h = x.new_zeros(batch, hidden)
    c = x.new_zeros(batch, hidden)
    prev_valid = torch.zeros(batch, dtype=torch.bool, device=x.device)
    names = ("h", "c", "c_prev", "h_prev", "i", "f", "g", "o", "g_pre")
    store: Dict[str, list] = {name: [None] * steps for name in names}
    first = torch.zeros(batch, steps, dtype=torch.bool, device=x.device)
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    for t in order:
        gates = pre_x[:, t] + h @ weight_hh.T
        i, f, g_pre, o = gates.chunk(4, dim=-1)
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g_pre), torch.sigmoid(o)
        c_new = f * c + i * g
        h_new = o * torch.tanh(c_new)
        keep = valid[:, t].unsqueeze(1)
        first[:, t] = valid[:, t] & ~prev_valid
        for name, value in (("c_prev", c), ("h_prev", h), ("i", i), ("f", f), ("g", g), ("o", o), ("g_pre", g_pre)):
            store[name][t] = value * keep
        c = torch.where(keep, c_new, torch.zeros_like(c_new))
        h = torch.where(keep, h_new, torch.zeros_like(h_new))
        store["c"][t], store["h"][t] = c, h
        prev_valid = valid[:, t]
    out = {name: torch.stack(values, dim=1) for name, values in store.items()}
    out["first"] = first
    out["valid"] = valid
    return out


def _lstm_direction_relevance(
    states: Dict[str, Tensor],
    x: Tensor,
    relevance_h: Tensor,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias: Tensor,
    *,
    reverse: bool,
    eps: float,
    bias_factor: float,
) -> Tensor:
    hidden = weight_hh.shape[1]
    steps = x.shape[1]
    w_g = torch.cat([weight_ih[2 * hidden : 3 * hidden], weight_hh[2 * hidden : 3 * hidden]], dim=1)  # [H, E + H]
    b_g = bias[2 * hidden : 3 * hidden]
    relevance_x = torch.zeros_like(x)
    carry_h = relevance_h.new_zeros(relevance_h.shape[0], hidden)
    carry_c = torch.zeros_like(carry_h)
    present_x = torch.ones_like(x[:, 0], dtype=torch.bool)
    # Backwards through time = the reverse of the processing order.
    order = range(steps) if reverse else range(steps - 1, -1, -1)
    for t in order:
        valid = states["valid"][:, t].unsqueeze(1)
        first = states["first"][:, t].unsqueeze(1)
        r_h = (relevance_h[:, t] + carry_h) * valid
        r_c = carry_c * valid + r_h  # signal-take-all: h = o * tanh(c) gives everything to c
        c, c_prev = states["c"][:, t], states["c_prev"][:, t]
        forget_part = states["f"][:, t] * c_prev
        input_part = states["i"][:, t] * states["g"][:, t]
        stab = eps * _sign(c)
        prev_share = torch.where(first, torch.zeros_like(c), torch.full_like(c, 0.5))
        scaled = _safe_div(r_c, c + stab)
        r_c_prev = (forget_part + bias_factor * stab * prev_share) * scaled
        r_g = (input_part + bias_factor * stab * (1 - prev_share)) * scaled
        # g = tanh(g_pre) (identity rule), g_pre = [x_t, h_prev] @ w_g.T + b_g (ε-rule)
        inputs = torch.cat([x[:, t], states["h_prev"][:, t]], dim=-1)
        present = torch.cat([present_x, (~first).expand(-1, hidden)], dim=-1)
        r_in = (
            lrp_linear(inputs, w_g, b_g, states["g_pre"][:, t], r_g, eps=eps, bias_factor=bias_factor, present=present)
            * valid
        )
        relevance_x[:, t] = r_in[:, : x.shape[-1]]
        carry_h = r_in[:, x.shape[-1] :] * ~first
        carry_c = r_c_prev * ~first
    return relevance_x


def _lstm_parameters(rnn: nn.LSTM, suffix: str) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    def get(name: str) -> Optional[Tensor]:
        return getattr(rnn, f"{name}_l0{suffix}", None)  # the biases are absent with bias=False

    weight_ih, weight_hh = get("weight_ih"), get("weight_hh")
    assert weight_ih is not None and weight_hh is not None  # an nn.LSTM has the weights of each direction
    return weight_ih, weight_hh, get("bias_ih"), get("bias_hh")


def lstm_rule(
    encoder: nn.Module, x: Tensor, input_mask: Tensor, relevance_hidden: Tensor, *, eps: float, bias_factor: float
) -> Tuple[Tensor, Tensor]:
    """Arras et al.'s LSTM rules for :class:`~lightning_xai.models.encoders.LSTMEncoder` (one or two directions).

    Example:
        >>> from lightning_xai.models.encoders import LSTMEncoder
        >>> enc = LSTMEncoder(3, 2)
        >>> x, mask = torch.randn(1, 4, 3), torch.ones(1, 4, dtype=torch.bool)
        >>> relevance_x, hidden = lstm_rule(enc, x, mask, torch.ones(1, 4, 4), eps=1e-3, bias_factor=0.0)
        >>> relevance_x.shape, torch.allclose(hidden, enc(x, mask), atol=1e-6)
        (torch.Size([1, 4, 3]), True)
    """
    rnn = encoder.rnn
    if not isinstance(rnn, nn.LSTM) or rnn.num_layers != 1 or rnn.proj_size != 0 or not rnn.batch_first:
        raise ValueError(f"LRP supports a single-layer, batch_first nn.LSTM without proj_size; got {rnn!r}.")
    lengths = input_mask.sum(1)
    _check_prefix_mask(input_mask)
    directions = [("", False)] + ([("_reverse", True)] if rnn.bidirectional else [])
    hidden = rnn.hidden_size
    relevance_x = torch.zeros_like(x)
    outputs = []
    for index, (suffix, reverse) in enumerate(directions):
        weight_ih, weight_hh, bias_ih, bias_hh = _lstm_parameters(rnn, suffix)
        w_ih, w_hh = weight_ih.to(x.dtype), weight_hh.to(x.dtype)
        b_ih, b_hh = (None if p is None else p.to(x.dtype) for p in (bias_ih, bias_hh))
        states = lstm_forward(x, lengths, w_ih, w_hh, b_ih, b_hh, reverse=reverse)
        outputs.append(states["h"])
        bias = torch.zeros(4 * hidden, dtype=x.dtype, device=x.device)
        bias = bias + (b_ih if b_ih is not None else 0.0) + (b_hh if b_hh is not None else 0.0)
        part = relevance_hidden[..., index * hidden : (index + 1) * hidden]
        relevance_x = relevance_x + _lstm_direction_relevance(
            states, x, part, w_ih, w_hh, bias, reverse=reverse, eps=eps, bias_factor=bias_factor
        )
    return relevance_x, torch.cat(outputs, dim=-1)


def per_token_rule(
    encoder: nn.Module, x: Tensor, input_mask: Tensor, relevance_hidden: Tensor, *, eps: float, bias_factor: float
) -> Tuple[Tensor, Tensor]:
    """A per-token encoder ``h_t = act(proj(x_t))`` (``encoder.proj`` an ``nn.Linear``): identity rule through
    the element-wise activation, ε-rule through ``proj``. Used for :class:`~lightning_xai.models.encoders.MLPEncoder`;
    register it for your own per-token encoders with :func:`register_lrp_encoder`.

    Example:
        >>> from lightning_xai.models.encoders import MLPEncoder
        >>> enc = MLPEncoder(3, 2)
        >>> x, mask = torch.randn(1, 4, 3), torch.ones(1, 4, dtype=torch.bool)
        >>> relevance_x, hidden = per_token_rule(enc, x, mask, torch.ones(1, 4, 2), eps=1e-3, bias_factor=1.0)
        >>> torch.allclose(relevance_x.sum(), torch.tensor(8.0), atol=1e-5)
        True
    """
    proj = getattr(encoder, "proj", None)
    if not isinstance(proj, nn.Linear):
        raise ValueError(
            f"per_token_rule needs encoder.proj to be an nn.Linear; {type(encoder).__name__} has {type(proj).__name__}."
        )
    weight = proj.weight.to(x.dtype)
    bias = None if proj.bias is None else proj.bias.to(x.dtype)
    pre = nn.functional.linear(x, weight, bias)
    relevance = lrp_linear(x, weight, bias, pre, relevance_hidden, eps=eps, bias_factor=bias_factor)
    return relevance * input_mask.unsqueeze(-1), encoder(x.to(proj.weight.dtype), input_mask).to(x.dtype)


def _check_prefix_mask(input_mask: Tensor) -> None:
    lengths = input_mask.sum(1, keepdim=True)
    expected = torch.arange(input_mask.shape[1], device=input_mask.device).unsqueeze(0) < lengths
    if not torch.equal(expected, input_mask):
        raise ValueError(
            "LRP for LSTMs needs right-padded rows (the real positions of each row first, then pads); "
            "the batch's input mask has gaps. Use the collate of TextClassificationDataModule."
        )

"""The AttnLRP rules as forward hooks on a ``transformers`` model's own modules (see :mod:`.attnlrp`).

Each hook returns ``value.detach() + surrogate − surrogate.detach()``: the module's own output in the forward pass
(bit-identical), the rule's gradient in the backward pass. :func:`attnlrp_rules` installs them for one forward and
removes them afterwards; the graph it built keeps the modified backward.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Tuple, cast

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = ["BiasTerm", "attnlrp_rules", "rewire"]

#: a tensor the forward consumed and the bias it carries (``None``: the whole tensor is a bias, e.g. positions)
BiasTerm = Tuple[Tensor, Optional[Tensor]]

_ACTIVATIONS = (nn.GELU, nn.SiLU, nn.Tanh, nn.ReLU, nn.Mish, nn.ELU, nn.LeakyReLU)


def rewire(value: Tensor, surrogate: Tensor) -> Tensor:
    """``value`` in the forward pass, ``surrogate``'s gradient in the backward pass.

    Example:
        >>> x = torch.tensor([2.0], requires_grad=True)
        >>> y = rewire(x ** 2, 3 * x)  # forward 4, backward 3
        >>> y.backward(); y.item(), x.grad.item()
        (4.0, 3.0)
    """
    return value.detach() + (surrogate - surrogate.detach())


def _scaled(value: Tensor, factor: float) -> Tensor:
    return rewire(value, value * factor)


def _identity_rule(x: Tensor, out: Tensor) -> Tensor:
    """``f(x)`` with backward ``stopgrad(f(x)/x)``: all of the output's relevance goes to ``x`` (0 where ``x = 0``)."""
    ratio = torch.where(x == 0, torch.zeros_like(out), out / torch.where(x == 0, torch.ones_like(x), x))
    return rewire(out, x * ratio.detach())


def _is_activation(module: nn.Module) -> bool:
    return isinstance(module, _ACTIVATIONS) or type(module).__module__ == "transformers.activations"


def _is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), Tensor)


def _layer_norm(module: nn.LayerNorm, x: Tensor, out: Tensor, record: Optional[List[BiasTerm]]) -> Tensor:
    centred = x - x.mean(-1, keepdim=True)
    std = (centred.pow(2).mean(-1, keepdim=True) + module.eps).sqrt()
    surrogate = centred / std.detach()
    if module.weight is not None:
        surrogate = surrogate * module.weight
    if module.bias is not None:
        surrogate = surrogate + module.bias
    result = rewire(out, surrogate)
    if record is not None and module.bias is not None:
        record.append((result, module.bias))
    return result


def _rms_norm(module: nn.Module, x: Tensor, out: Tensor) -> Tensor:
    """``w · x / stopgrad(rms(x))`` (Llama) or ``(1 + w) · ...`` (Gemma), whichever the module computed."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    normed = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype).detach()
    rtol, atol = 1e-3, 1e-5 * float(out.detach().abs().max().clamp_min(1.0))
    weight = cast(Tensor, module.weight)  # _is_rms_norm checked it is a Tensor
    for gain in (weight, 1.0 + weight):
        surrogate = normed * gain.to(x.dtype)
        if torch.allclose(surrogate.detach().to(out.dtype), out.detach(), rtol=rtol, atol=atol):
            return rewire(out, surrogate)
    raise ProtocolError(
        f"{type(module).__name__} computes neither w·x/rms(x) nor (1+w)·x/rms(x); attnlrp has no rule for this norm."
    )


def _projections(net: nn.Module) -> Iterator[Tuple[nn.Module, float]]:
    """The attention's query/key/value projections with their gradient factor (1/4, 1/4, 1/2)."""
    for module in net.modules():
        for q, k, v in (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"), ("q_proj", "k_proj", "v_proj")):
            if all(isinstance(getattr(module, n, None), nn.Linear) for n in (q, k, v)):
                yield getattr(module, q), 0.25
                yield getattr(module, k), 0.25
                yield getattr(module, v), 0.5


def _hook_all(
    net: nn.Module, word_embedding: Optional[nn.Module], record: Optional[List[BiasTerm]], batch_size: int
) -> List[Any]:
    handles: List[Any] = []

    def on(module: nn.Module, fn: Any, pre: bool = False) -> None:
        handles.append(module.register_forward_pre_hook(fn) if pre else module.register_forward_hook(fn))

    if record is not None:  # first: a Linear's own output, before a rule below rewires it
        for module in net.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                on(module, lambda m, a, o: record.append((o, m.bias)))
            elif isinstance(module, nn.Embedding) and module is not word_embedding:
                on(module, lambda m, a, o: _as_bias_input(o, record, batch_size))
    for module, factor in _projections(net):
        on(module, lambda m, a, o, f=factor: _scaled(o, f))
    for module in net.modules():
        if _is_activation(module):
            on(module, lambda m, a, o: _identity_rule(a[0], o))
        elif isinstance(module, nn.LayerNorm):
            on(module, lambda m, a, o: _layer_norm(m, a[0], o, record))
        elif _is_rms_norm(module):
            on(module, lambda m, a, o: _rms_norm(m, a[0], o))
        if all(isinstance(getattr(module, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
            on(cast(nn.Linear, module.down_proj), lambda m, a: (_scaled(a[0], 0.5),) + tuple(a[1:]), pre=True)
        if isinstance(getattr(module, "dense", None), nn.Linear) and isinstance(
            getattr(module, "out_proj", None), nn.Linear
        ):
            _functional_head(module, on)
    return handles


def _as_bias_input(out: Tensor, record: List[BiasTerm], batch_size: int) -> Tensor:
    """A position / token-type embedding as a leaf with one row per example (its relevance is read per row)."""
    value = out.detach()
    if value.dim() >= 2 and value.shape[0] == 1 and batch_size > 1:
        value = value.expand(batch_size, *value.shape[1:])
    leaf = value.clone().requires_grad_(True)
    record.append((leaf, None))
    return leaf


def _functional_head(head: nn.Module, on: Any) -> None:
    """``dense → f → out_proj`` with ``f`` elementwise and possibly functional (RoBERTa's ``torch.tanh``)."""
    seen: List[Tensor] = []

    def keep(module: nn.Module, args: tuple, out: Tensor) -> None:
        seen[:] = [out]

    def swap(module: nn.Module, args: tuple) -> Optional[tuple]:
        if not seen or seen[0].shape != args[0].shape:
            return None
        return (_identity_rule(seen.pop(), args[0]),) + tuple(args[1:])

    on(head.dense, keep)
    on(head.out_proj, swap, pre=True)


@contextmanager
def attnlrp_rules(net: nn.Module, record: Optional[List[BiasTerm]] = None, batch_size: int = 1) -> Iterator[None]:
    """Install the AttnLRP rules on ``net`` for the forward passes run inside (hooks removed on exit).

    Args:
        net: a ``transformers`` model of a family AttnLRP supports (checked by the caller).
        record: if given, every bias term the forward consumes is appended as ``(tensor, bias)`` (see
            :data:`BiasTerm`); position / token-type embedding outputs become leaves requiring grad, with
            ``batch_size`` rows.
        batch_size: the batch's row count (only used with ``record``).

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> net = BertModel(BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                            intermediate_size=16)).eval()
        >>> ids = torch.tensor([[1, 4, 5, 2]])
        >>> with attnlrp_rules(net):
        ...     patched = net(input_ids=ids).last_hidden_state
        >>> torch.equal(patched, net(input_ids=ids).last_hidden_state)
        True
    """
    getter = getattr(net, "get_input_embeddings", None)
    handles = _hook_all(net, getter() if callable(getter) else None, record, batch_size)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()

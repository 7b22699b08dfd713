"""PyTorch's own attention modules seen through :class:`~lightning_xai.adapters.HookAdapter`, unchanged.

``nn.TransformerEncoderLayer`` calls its ``self_attn`` (an ``nn.MultiheadAttention``) with ``need_weights=False``,
and in eval mode without gradients PyTorch takes a *fast path* (a fused kernel, nested tensors in
``nn.TransformerEncoder``) that never calls ``self_attn`` at all. For the adapter's own passes only:

* :func:`slow_attention` switches the fast path off (``torch.backends.mha.set_fastpath_enabled(False)``) and
  restores the previous setting on exit, whatever happens inside — training and every other forward pass keep
  the fast path exactly as the user has it;
* :class:`MultiheadHooks` (a forward pre-hook and a forward hook, removed after the pass) makes the module compute
  ``need_weights=True, average_attn_weights=False`` (per-head ``[B, heads, T, S]`` probabilities, PyTorch's
  own slow-path computation), records them, and returns to the caller what it asked for (``None`` weights for
  ``need_weights=False``, the head mean for ``average_attn_weights=True``);
* an attention override (new probabilities for some query rows) recomputes those rows' outputs from the module's
  own value and output projections, ``out_proj(Σ_s p_{h,q,s} · v_{h,s})``, with dropout as the module applies it;
  the other rows keep PyTorch's output bit for bit.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = ["MultiheadHooks", "multihead_attention_of", "pooled_rows", "slow_attention"]

#: ``nn.MultiheadAttention.forward``'s parameters, to read positional and keyword calls alike
_PARAMETERS = list(inspect.signature(nn.MultiheadAttention.forward).parameters)[1:]


def multihead_attention_of(module: nn.Module, name: str) -> Optional[nn.MultiheadAttention]:
    """The ``nn.MultiheadAttention`` that ``module`` is (or, for a transformer layer, holds as ``self_attn``);
    ``None`` for any other module.

    Raises:
        ProtocolError: an ``nn.MultiheadAttention`` whose extra key/value rows (``add_bias_kv``,
            ``add_zero_attn``) have no token to report.

    Example:
        >>> from torch import nn
        >>> layer = nn.TransformerEncoderLayer(8, 2, batch_first=True)
        >>> multihead_attention_of(layer, "layer") is layer.self_attn, multihead_attention_of(nn.Softmax(-1), "s")
        (True, None)
    """
    found = module if isinstance(module, nn.MultiheadAttention) else getattr(module, "self_attn", None)
    if not isinstance(found, nn.MultiheadAttention):
        return None
    if found.bias_k is not None or found.add_zero_attn:
        raise ProtocolError(
            f"HookAdapter: the nn.MultiheadAttention at {name!r} adds key/value rows of its own "
            "(add_bias_kv=True or add_zero_attn=True), which belong to no token; build it without "
            "them, or compute the softmax in a module of its own and name that module."
        )
    return found


@contextlib.contextmanager
def slow_attention() -> Iterator[None]:
    """Switch PyTorch's transformer fast path off inside the block; restore the previous setting on exit.

    Example:
        >>> import torch
        >>> before = torch.backends.mha.get_fastpath_enabled()
        >>> with slow_attention():
        ...     torch.backends.mha.get_fastpath_enabled()
        False
        >>> torch.backends.mha.get_fastpath_enabled() == before
        True
    """
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def pooled_rows(pooling: str, query_index: Optional[int], mask: Tensor) -> Tensor:
    """``[B, T]``: the weight of each query row in the representation the classifier reads.

    ``"first"``: row 0 (``[CLS]``); ``"index"``: row ``query_index`` (negative counts from the end); ``"mean"``:
    the mean over the real tokens of ``mask`` (each real row ``1 / n``).

    Example:
        >>> import torch
        >>> mask = torch.tensor([[True, True, False]])
        >>> pooled_rows("mean", None, mask).tolist(), pooled_rows("index", -1, mask).tolist()
        ([[0.5, 0.5, 0.0]], [[0.0, 0.0, 1.0]])
    """
    B, T = mask.shape
    if pooling == "mean":
        real = mask.float()
        return real / real.sum(-1, keepdim=True).clamp_min(1.0)
    if pooling == "first":
        index = 0
    elif query_index is None:
        raise TypeError(f"pooled_rows(pooling={pooling!r}) needs query_index (the row the classifier reads); got None.")
    else:
        index = int(query_index)
    if not -T <= index < T:
        raise ValueError(f"HookAdapter: query_index={index} is outside the batch's {T} positions.")
    rows = torch.zeros(B, T, device=mask.device)
    rows[:, index % T] = 1.0
    return rows


def _batch_first(mha: nn.MultiheadAttention, tensor: Tensor) -> Tensor:
    return tensor if mha.batch_first else tensor.transpose(0, 1)


def _mixed_rows(mha: nn.MultiheadAttention, call: Dict[str, Any], probabilities: Tensor) -> Tensor:
    """``[B, T, E]``: ``out_proj`` of the value rows mixed by ``probabilities`` ``[B, heads, T, S]``."""
    value = _batch_first(mha, call["value"])
    B, S, _ = value.shape
    E, H = mha.embed_dim, mha.num_heads
    weight = mha.in_proj_weight[2 * E :] if mha._qkv_same_embed_dim else mha.v_proj_weight
    bias = None if mha.in_proj_bias is None else mha.in_proj_bias[2 * E :]
    v = F.linear(value, weight, bias).view(B, S, H, E // H).transpose(1, 2)  # [B, H, S, d]
    probabilities = F.dropout(probabilities, p=mha.dropout, training=mha.training)
    mixed = (probabilities @ v).transpose(1, 2).reshape(B, probabilities.shape[2], E)
    return F.linear(mixed, mha.out_proj.weight, mha.out_proj.bias)


class MultiheadHooks:
    """The pre-hook and hook that read (and optionally replace) an ``nn.MultiheadAttention``'s probabilities.

    ``on_weights(probabilities)`` gets the per-head ``[B, heads, T, S]`` probabilities of every call and returns
    ``None`` (keep them) or ``(new_probabilities, rows)``: the module's output is then recomputed at the query
    rows where ``rows`` (bool ``[B, T]``) is True. Use as a context manager: the hooks are removed on exit.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
        >>> x, seen = torch.randn(1, 3, 8), []
        >>> with MultiheadHooks(mha, lambda p: seen.append(p.shape)), slow_attention():
        ...     out, weights = mha(x, x, x, need_weights=False)
        >>> seen, weights, len(mha._forward_hooks) + len(mha._forward_pre_hooks)
        ([torch.Size([1, 2, 3, 3])], None, 0)
    """

    def __init__(
        self, mha: nn.MultiheadAttention, on_weights: Callable[[Tensor], Optional[Tuple[Tensor, Tensor]]]
    ) -> None:
        self.mha, self.on_weights = mha, on_weights
        self._asked: List[Tuple[bool, bool]] = []
        self._handles: List[Any] = []

    def __enter__(self) -> "MultiheadHooks":
        self._handles = [
            self.mha.register_forward_pre_hook(self._before, with_kwargs=True),
            self.mha.register_forward_hook(self._after, with_kwargs=True),
        ]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _before(
        self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]
    ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        call = dict(zip(_PARAMETERS, args), **kwargs)
        self._asked.append((bool(call.get("need_weights", True)), bool(call.get("average_attn_weights", True))))
        call.update(need_weights=True, average_attn_weights=False)
        return (), call

    def _after(self, module: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any], output: Any) -> Any:
        need, average = self._asked.pop()
        attended, probabilities = output
        if probabilities is None or probabilities.dim() != 4:
            raise ProtocolError(
                "HookAdapter: nn.MultiheadAttention gave no per-head [B, heads, T, S] weights "
                "(an unbatched call?); call it on batched inputs."
            )
        replaced = self.on_weights(probabilities)
        if replaced is not None:
            probabilities, rows = replaced
            recomputed = _mixed_rows(self.mha, kwargs, probabilities)
            attended = _batch_first(
                self.mha,
                torch.where(rows[:, :, None].to(recomputed.device), recomputed, _batch_first(self.mha, attended)),
            )
        if not need:
            return attended, None
        return attended, probabilities.mean(dim=1) if average else probabilities

"""lightning_xai's attention function for ``transformers`` models: eager attention with a replaceable query row.

The function is registered in transformers' attention-interface registry (``AttentionInterface.register`` and
``AttentionMaskInterface.register``) under the name :data:`ATTENTION_IMPLEMENTATION`. It calls the module's own
eager attention (so grouped-query attention, rotary embeddings, sliding windows, soft-capping and local/global
layers behave exactly as the modeling file says) and, only inside an override and only for the target module,
replaces the probabilities of the *query positions the classifier reads* (one per row, or several for mean
pooling) and recomputes ``weights @ values``. Outside an override it *is* eager attention.

:func:`use_registered_attention` is the one place where a model's attention implementation is switched;
:func:`recording_attention` switches it for the duration of a ``with`` block only, so a model keeps training
on the implementation it was loaded with (``sdpa``, flash) and only explanation passes run on this one.

**What an override means** (:class:`~lightning_xai.adapters.HuggingFaceAdapter`'s ``attention_override``, applied
by :func:`override_rows`):

* ``attention_override`` replaces the **last layer's pooled query row(s)** of the attention probabilities, for every
  head, before they multiply the values. The classifier reads only the last layer's pooled state(s), so this
  row is the whole of the last layer's token mixing that reaches the logits; every earlier layer is unchanged.

  - ``[B, T]``: one distribution over real tokens, used as given (not renormalised; values outside the token mask
    are ignored). With ``override_specials="keep"`` (default) each head keeps its own mass ``s_h`` on the special
    tokens and gives ``(1 - s_h) · override`` to the real tokens, so uniform/permuted/erased attention changes *which*
    real tokens are read, not how much the head reads ``[SEP]``. With ``"zero"`` the row becomes exactly the
    override (0 on special tokens).
  - ``[B, heads, T]``: full raw rows per head over all positions (special tokens included; pads forced to 0), used
    as given. Passing ``extras["cls_rows"]`` of a previous pass reproduces its logits **exactly** (bit for bit in
    eval mode). A ``[B, T]`` override reproduces the logits only when all heads share one distribution over real
    tokens (e.g. a one-head model), up to float rounding.

  Many overrides of a batch's rows are scored by
  :meth:`~lightning_xai.adapters.HuggingFaceAdapter.override_replay`
  (:mod:`lightning_xai.adapters.huggingface.replay`): every layer before the last is replayed from one recorded
  pass, and where the head reads one position the overrides of a row share one sequence
  (:mod:`lightning_xai.adapters.huggingface.packing`).

  DeBERTa-v2/v3 gets the same rows through a hook (:mod:`lightning_xai.adapters.huggingface.native`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.huggingface.families import native_attention
from lightning_xai.adapters.protocol import ProtocolError

__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "OverrideState",
    "active_override",
    "override_rows",
    "recording_attention",
    "register_attention_implementation",
    "replace_pooled_rows",
    "rows_read_own",
    "use_registered_attention",
]

#: The name under which lightning_xai's attention function is registered with transformers.
ATTENTION_IMPLEMENTATION = "lightning_xai_eager"


@dataclass
class OverrideState:
    """One override: the target attention module, the query positions replaced, and how rows are made."""

    module: nn.Module
    query_mask: Tensor  # [B, T] bool: the query positions whose rows are replaced
    make_rows: Callable[[Tensor], Tensor]  # own weights [B, H, T, T] -> proposed weights, same shape
    calls: int = 1  # how many times the module runs in one forward (layers sharing it); the last call is replaced
    seen: int = 0
    #: ``(first, keys)``: the pass reads only query rows ``first …`` of the replaced call's output, and no query
    #: attends to a key column ``keys …`` (masked for every row); the call then computes that block only, and
    #: ``query_mask`` and ``make_rows`` see ``[B, T − first]`` and ``[B, H, T − first, keys]`` (a packed pass,
    #: :mod:`~lightning_xai.adapters.huggingface.packing`: the copies are its last rows, the row's own keys its first)
    window: Optional[Tuple[int, int]] = None
    #: whether ``make_rows`` reads the values of the layer's own weights (``override_rows``' special-token mass,
    #: :func:`rows_read_own`); ``False``: only their shape, so a windowed call, every row of which is replaced or never
    #: read, skips computing them (the scores and the softmax of the copies' rows)
    reads_own: bool = True


_ACTIVE_OVERRIDE: contextvars.ContextVar[Optional[OverrideState]] = contextvars.ContextVar(
    "lightning_xai_attention_override", default=None
)
_EAGER_CACHE: Dict[type, Callable] = {}


def active_override() -> contextvars.ContextVar:
    """The context variable holding the :class:`OverrideState` of the running override (``None`` outside one)."""
    return _ACTIVE_OVERRIDE


def _eager_for(module: nn.Module) -> Callable:
    """The eager attention function of the module's own modeling file (BERT's when it has none)."""
    cls = type(module)
    if cls not in _EAGER_CACHE:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if not callable(fn):
            fn = importlib.import_module("transformers.models.bert.modeling_bert").eager_attention_forward
        _EAGER_CACHE[cls] = fn
    return _EAGER_CACHE[cls]


def _lightning_xai_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> Tuple[Tensor, Tensor]:
    """Eager attention; inside an override, the target module's pooled query rows are replaced, ``weights @ v`` redone.

    An additive float mask is clamped at float32's minimum first, so a fully masked (pad) query row gets finite
    weights instead of NaN, which would poison every gradient: two stacked masks (padding + sliding window,
    ModernBERT) sum to ``-inf``, and a float64 mask's minimum becomes ``-inf`` where the modeling file takes the
    softmax in float32 (Llama family). Rows with any visible key are unchanged.
    """
    state = _ACTIVE_OVERRIDE.get()
    window = state.window if state is not None and state.module is module and state.seen + 1 == state.calls else None
    T = query.shape[2]
    if window is not None:  # only the rows read, against the keys any row sees: the rest is never used
        first, keys = window
        query, key, value = query[:, :, first:], key[:, :, :keys], value[:, :, :keys]
        if attention_mask is not None:
            rows = slice(first, None) if attention_mask.shape[-2] == T else slice(None)
            attention_mask = attention_mask[:, :, rows, :keys] if attention_mask.shape[-1] == T else attention_mask
    if attention_mask is not None and attention_mask.is_floating_point():
        floor = max(torch.finfo(attention_mask.dtype).min, torch.finfo(torch.float32).min)
        attention_mask = attention_mask.clamp_min(floor)
    if window is not None and state is not None and not state.reads_own:
        # every row of the window is a replaced row or one nothing reads, and the replacement does not read the own
        # weights: the eager scores and softmax would be thrown away (zeros stand for them, as for unread rows)
        output: Optional[Tensor] = None
        weights = query.new_zeros(*query.shape[:3], key.shape[2])
    else:
        output, weights = _eager_for(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    replaced = replace_pooled_rows(module, weights)
    if replaced is not None:
        weights = replaced
        if value.shape[1] != weights.shape[1]:  # grouped-query attention: kv head k serves heads k*g .. k*g+g-1
            value = value.repeat_interleave(weights.shape[1] // value.shape[1], dim=1)
        output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    assert output is not None  # a call that skipped the eager weights is the override's target: replaced above
    if window is not None:  # the rows before the window are not read: zeros keep the layer's shapes
        output = torch.cat([output.new_zeros(output.shape[0], window[0], *output.shape[2:]), output], 1)
    return output, weights


def replace_pooled_rows(module: nn.Module, weights: Tensor) -> Optional[Tensor]:
    """``weights`` ``[B, H, T, T]`` of ``module`` with the running override's pooled query rows replaced, or ``None``
    when no override targets this call of ``module`` (outside an override, another module, or an earlier call of a
    module shared by several layers: ALBERT's, of which only the last call is replaced)."""
    state = _ACTIVE_OVERRIDE.get()
    if state is None or state.module is not module:
        return None
    state.seen += 1
    if state.seen != state.calls:
        return None
    proposed = state.make_rows(weights).to(weights.dtype)
    if proposed.shape != weights.shape:
        raise ValueError(
            f"attention override rows have shape {tuple(proposed.shape)}; the layer's weights are "
            f"{tuple(weights.shape)}."
        )
    where = state.query_mask.to(weights.device)[:, None, :, None]
    return torch.where(where, proposed, weights)


def rows_read_own(override: Tensor, attention_mask: Tensor, mask: Tensor, specials: str) -> bool:
    """Whether :func:`override_rows` of these arguments reads the values of the layer's own weights: only a
    ``[B, T]`` override that keeps each head's mass on special tokens (``specials="keep"``) where some row has a
    special token (``attention_mask`` True, ``mask`` False) does.

    Example:
        >>> import torch
        >>> present = torch.tensor([[True, True, True]])
        >>> rows_read_own(torch.ones(1, 3) / 3, present, torch.tensor([[False, True, True]]), "keep")
        True
        >>> rows_read_own(torch.ones(1, 3) / 3, present, torch.tensor([[True, True, True]]), "keep")
        False
    """
    return override.dim() == 2 and specials == "keep" and bool((attention_mask & ~mask).any())


def override_rows(override: Tensor, attention_mask: Tensor, mask: Tensor, specials: str) -> Callable[[Tensor], Tensor]:
    """How an ``attention_override`` turns a layer's own weights ``[B, H, T, T]`` into the replacement rows.

    Args:
        override: ``[B, T]`` a distribution over real tokens, or ``[B, heads, T]`` full raw rows.
        attention_mask: ``[B, T]`` bool, True at non-pad positions (special tokens included).
        mask: ``[B, T]`` bool, True at real tokens.
        specials: ``"keep"`` (each head keeps its own mass on special tokens) or ``"zero"``.

    Returns:
        ``make_rows(weights) -> [B, H, T, T]``: every query row proposed (only the pooled rows are used).

    Example:
        >>> import torch
        >>> make = override_rows(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[True, True, True]]),
        ...                      torch.tensor([[False, True, True]]), "keep")
        >>> make(torch.full((1, 1, 3, 3), 1 / 3))[0, 0, 0]
        tensor([0.3333, 0.6667, 0.0000])
    """
    B, T = mask.shape
    if override.dim() == 2:
        if override.shape != (B, T):
            raise ValueError(
                f"attention_override has shape {tuple(override.shape)}; expected the token mask's "
                f"{(B, T)} (or [B, heads, T] raw rows)."
            )
        real = override.masked_fill(~mask, 0.0)
        special = (attention_mask & ~mask)[:, None, None, :]
        keeps = rows_read_own(override, attention_mask, mask, specials)  # no special token: no mass to keep

        def make_rows(own: Tensor) -> Tensor:
            proposal = real[:, None, None, :].to(own.dtype).expand_as(own)
            if not keeps:
                return proposal
            kept = own * special
            return kept + proposal * (1 - kept.sum(dim=-1, keepdim=True))

        return make_rows
    if override.dim() == 3:
        if override.shape[0] != B or override.shape[2] != T:
            raise ValueError(
                f"attention_override has shape {tuple(override.shape)}; expected [B, heads, T] = "
                f"[{B}, heads, {T}] raw rows (or the token mask's [B, T])."
            )

        def make_rows(own: Tensor) -> Tensor:
            if override.shape[1] != own.shape[1]:
                raise ValueError(
                    f"attention_override has {override.shape[1]} heads; the last layer has {own.shape[1]}."
                )
            rows = override.to(own.dtype) * attention_mask[:, None, :].to(own.dtype)
            return rows[:, :, None, :].expand_as(own)

        return make_rows
    raise ValueError(f"attention_override must be [B, T] or [B, heads, T]; got {tuple(override.shape)}.")


def register_attention_implementation() -> str:
    """Register lightning_xai's attention function (and its eager mask) with transformers; returns its name.

    Idempotent. Afterwards ``model.set_attn_implementation(ATTENTION_IMPLEMENTATION)`` (or
    ``from_pretrained(..., attn_implementation=ATTENTION_IMPLEMENTATION)``) selects it.

    Example:
        >>> register_attention_implementation()
        'lightning_xai_eager'
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
    except ImportError as error:  # pragma: no cover - depends on the installed version
        raise ImportError(
            "HuggingFaceAdapter needs `transformers` with AttentionInterface and "
            "AttentionMaskInterface (transformers >= 4.53): pip install 'lightning-xai[hf]'."
        ) from error
    AttentionInterface.register(ATTENTION_IMPLEMENTATION, _lightning_xai_attention)
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, eager_mask)
    return ATTENTION_IMPLEMENTATION


def use_registered_attention(model: nn.Module, warn: bool = True) -> bool:
    """Switch ``model`` to lightning_xai's registered eager attention; the one place the implementation changes.

    Returns ``True`` when the model now dispatches through :data:`ATTENTION_IMPLEMENTATION` (overrides possible),
    ``False`` for the families with native attention in the family table (DeBERTa,
    :mod:`~lightning_xai.adapters.huggingface.families`), whose attention is computed by the
    modeling file itself: their maps are read from ``output_attentions`` and overrides are refused by name.
    With ``warn``, warns when the model was on ``sdpa``/flash attention (no attention maps there).

    Raises:
        ProtocolError: any other model that does not dispatch through transformers' ``AttentionInterface``.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                     intermediate_size=8, attn_implementation="eager")
        >>> use_registered_attention(BertForSequenceClassification(config))
        True
    """
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    register_attention_implementation()  # also when a saved config already names it (new process)
    if current == ATTENTION_IMPLEMENTATION:
        return True
    if native_attention(config):
        return False
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        try:
            setter(ATTENTION_IMPLEMENTATION)
        except (ValueError, KeyError, ImportError):
            pass
    if getattr(config, "_attn_implementation", None) != ATTENTION_IMPLEMENTATION:
        raise ProtocolError(
            f"{type(model).__name__} (attention implementation {current!r}) does not dispatch attention through "
            "transformers' AttentionInterface, so its attention maps cannot be read or overridden. Use a model "
            "class that supports attn_implementation switching, or HookAdapter on its attention modules."
        )
    if warn and current not in (None, "eager"):
        warnings.warn(
            f"{type(model).__name__} used attn_implementation={current!r}, which returns no attention "
            f"maps; switched it to lightning_xai's eager attention ({ATTENTION_IMPLEMENTATION!r}). "
            "Load it with attn_implementation='eager' to avoid this message.",
            stacklevel=4,
        )
    return True


#: per model, what :func:`use_registered_attention` set on each config the first time (the checks and the walk
#: over every module of ``set_attn_implementation`` cost milliseconds per call; later switches assign these)
_SWITCHED: "weakref.WeakKeyDictionary[nn.Module, Tuple[Any, List[Tuple[Any, Any]], bool]]" = weakref.WeakKeyDictionary()


def _attention_configs(model: nn.Module) -> List[Any]:
    """Every config whose ``_attn_implementation`` the model's modules read (its own, its submodels', sub-configs)."""
    configs: Dict[int, Any] = {}
    pending = [getattr(m, "config", None) for m in model.modules() if hasattr(m, "_can_set_attn_implementation")]
    pending.append(getattr(model, "config", None))
    while pending:
        config = pending.pop()
        if config is None or id(config) in configs or not hasattr(config, "_attn_implementation_internal"):
            continue
        configs[id(config)] = config
        pending.extend(getattr(config, key, None) for key in getattr(config, "sub_configs", {}) or {})
    return list(configs.values())


@contextlib.contextmanager
def recording_attention(model: nn.Module) -> Iterator[bool]:
    """Inside the block ``model`` runs on lightning_xai's recording attention; on exit it is back on its own.

    Yields what :func:`use_registered_attention` returns (whether overrides are possible). A model already on
    :data:`ATTENTION_IMPLEMENTATION` is left as it is (nested blocks cost nothing); otherwise every config's
    implementation is saved and restored exactly, so a model loaded with ``sdpa`` trains on ``sdpa``.

    Raises:
        ProtocolError: as :func:`use_registered_attention`.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                     intermediate_size=8, attn_implementation="sdpa")
        >>> model = BertForSequenceClassification(config)
        >>> with recording_attention(model):
        ...     model.config._attn_implementation
        'lightning_xai_eager'
        >>> model.config._attn_implementation
        'sdpa'
    """
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == ATTENTION_IMPLEMENTATION:
        register_attention_implementation()
        yield True
        return
    switched = _SWITCHED.get(model)
    if switched is not None and switched[0] is config:  # the second time: assign what the setter chose then
        saved = [(c, c._attn_implementation_internal) for c, _ in switched[1]]
        for owner, implementation in switched[1]:
            owner._attn_implementation_internal = implementation
        overridable = switched[2]
    else:
        saved = [(c, c._attn_implementation_internal) for c in _attention_configs(model)]
    try:
        if switched is None or switched[0] is not config:
            overridable = use_registered_attention(model, warn=False)
            _SWITCHED[model] = (config, [(c, c._attn_implementation_internal) for c, _ in saved], overridable)
        yield overridable
    finally:
        for owner, implementation in saved:
            owner._attn_implementation_internal = implementation

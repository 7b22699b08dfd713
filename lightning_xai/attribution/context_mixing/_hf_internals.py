"""Read a transformers classifier's attention blocks through its own modules and forward hooks.

The context-mixing methods need, per layer, what the attention probabilities multiply (the value vectors), the
output projection ``W_O`` that maps them back to the residual stream, the residual stream itself and, for
post-LN families, the layer norm after the residual sum. They are taken from the model's own modules, where the
family table (:mod:`lightning_xai.adapters.huggingface.families`: ``Layout``) says they are; a family the table does
not list is matched against every layout:

* **BERT family** (``BertLayer``-like: BERT, RoBERTa, MiniLM, ELECTRA, XLM-R, Camembert, ...):
  ``attention.self.value``, ``attention.output.dense``, ``attention.output.LayerNorm`` (post-LN).
* **DistilBERT** (``TransformerBlock``): ``attention.v_lin``, ``attention.out_lin``, ``sa_layer_norm`` (post-LN).
* **Llama family** (``LlamaDecoderLayer``-like: Llama, Qwen2, Mistral, ...): ``self_attn.v_proj``, ``self_attn.o_proj``,
  ``input_layernorm`` before attention (pre-norm, no norm after the residual sum); grouped-query heads supported.

One traced forward of the adapter records every layer's input (the residual stream), the input and output of the
value projection (values include ``b_V``), the output projection's output (includes ``b_O``), the layer's output and
its call arguments (to re-run one layer, e.g. with some value vectors zeroed).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

import torch
from torch import Tensor, nn

from lightning_xai.adapters.capabilities import TargetSequence
from lightning_xai.adapters.huggingface.families import LAYOUTS, Layout, layout_of
from lightning_xai.adapters.protocol import Batch, ExplainOutput, ProtocolError
from lightning_xai.attribution.targets import resolve_target

__all__ = [
    "UNSHARDABLE",
    "LayerParts",
    "Trace",
    "adapter_model",
    "block_tail",
    "head_outputs",
    "layer_index",
    "layer_parts",
    "mix_vectors",
    "normalise_rows",
    "pad_mask",
    "query_positions",
    "query_weights",
    "rerun_layer",
    "rollout_rows",
    "tail_reproduces",
    "trace",
    "traced_layers",
]

#: why the methods that run a layer's parts themselves (value mixing, ALTI, value zeroing) cannot explain a model
#: sharded with FSDP2: a part called outside its layer's forward reads sharded parameters (DTensors)
UNSHARDABLE = (
    "it calls the parts of each layer (attention value and output projections, LayerNorms) outside the "
    "layer's forward, where FSDP2 has not gathered their parameters"
)


@dataclass
class LayerParts:
    """The modules of one attention block (see the module docstring for where each comes from)."""

    block: nn.Module
    value: nn.Linear
    out: nn.Linear
    norm_after: Optional[nn.Module]
    n_heads: int
    n_kv_heads: int
    family: str

    @property
    def head_dim(self) -> int:
        return self.value.out_features // self.n_kv_heads


def _parts_of(module: nn.Module, layouts: Tuple[Layout, ...], n_heads: int, n_kv: int) -> Optional[LayerParts]:
    """The first of ``layouts`` that ``module`` has, as :class:`LayerParts` (``None``: a block of none of them)."""
    for layout in layouts:
        parts = layout.parts(module)
        if parts is not None:
            kv = n_kv if layout.name == "llama" else n_heads
            # the layouts name linear projections (a PEFT layer around one has its weight and out_features too)
            value, out = cast(nn.Linear, parts[0]), cast(nn.Linear, parts[1])
            return LayerParts(module, value, out, parts[2], n_heads, kv, layout.name)
    return None


def layer_parts(model: nn.Module) -> List[LayerParts]:
    """The attention blocks of ``model`` (a ``transformers`` model), first layer first.

    Raises:
        ProtocolError: the model's layers are none of the supported layouts.
    """
    config = getattr(model, "config", None)
    n_heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_heads", None)
    if not n_heads:
        raise ProtocolError(
            f"{type(model).__name__}'s config has no num_attention_heads; the context-mixing methods "
            "need the head count to split value vectors into heads."
        )
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    listed = layout_of(config)  # the family table's layout; a family it does not list is matched against all
    layouts = (listed,) if listed is not None else LAYOUTS
    found = [p for p in (_parts_of(m, layouts, int(n_heads), int(n_kv)) for m in model.modules()) if p is not None]
    if not found:
        raise ProtocolError(
            f"{type(model).__name__} has no attention block the context-mixing methods can read: they support the "
            "BERT family (attention.self.value / attention.output.dense / .LayerNorm), DistilBERT (attention.v_lin / "
            "out_lin / sa_layer_norm) and the Llama family (self_attn.v_proj / o_proj / input_layernorm). Use "
            "'rollout', 'attention' or a gradient method for this model."
        )
    return found


@dataclass
class Trace:
    """What one traced forward recorded, per layer (lists indexed by layer)."""

    output: ExplainOutput
    parts: List[LayerParts]
    block_in: List[Tensor] = field(default_factory=list)
    values: List[Tensor] = field(default_factory=list)
    out_proj: List[Tensor] = field(default_factory=list)
    block_out: List[Tensor] = field(default_factory=list)
    norm_out: List[Optional[Tensor]] = field(default_factory=list)
    calls: List[Tuple[tuple, Dict[str, Any]]] = field(default_factory=list)

    @property
    def attentions(self) -> Tuple[Tensor, ...]:
        raw = self.output.raw_attentions
        if not raw or len(raw) != len(self.parts):
            raise ProtocolError(
                f"the model returned {0 if not raw else len(raw)} attention maps for "
                f"{len(self.parts)} attention blocks; it must run eager attention "
                "(HuggingFaceAdapter switches it) with one self-attention per block."
            )
        return raw


def _first(output: Any) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


@contextmanager
def _hooks(registrations: List[Callable[[], Any]]) -> Iterator[None]:
    handles = [register() for register in registrations]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def trace(adapter: Any, batch: Batch, embeddings: Optional[Tensor] = None) -> Trace:
    """Run ``adapter.forward_from_embeddings`` once, recording every attention block (see :class:`Trace`)."""
    parts = layer_parts(adapter_model(adapter))
    slots: Dict[str, List[Any]] = {
        k: [None] * len(parts) for k in ("block_in", "values", "out_proj", "block_out", "norm_out", "calls")
    }

    def store(key: str, index: int, value: Any) -> None:
        if slots[key][index] is None:  # the first call is the layer's own (no re-entrant calls expected)
            slots[key][index] = value

    def layer_registrations(i: int, p: LayerParts) -> List[Callable[[], Any]]:
        """The hooks recording layer ``i`` (bound to this ``i`` and ``p``), to register when the pass starts."""

        def pre(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            store("block_in", i, hidden)
            store("calls", i, (tuple(args), dict(kwargs)))

        hooks: List[Callable[[], Any]] = [
            lambda: p.block.register_forward_pre_hook(pre, with_kwargs=True),
            lambda: p.block.register_forward_hook(lambda m, a, o: store("block_out", i, _first(o))),
            lambda: p.value.register_forward_hook(lambda m, a, o: store("values", i, o)),
            lambda: p.out.register_forward_hook(lambda m, a, o: store("out_proj", i, o)),
        ]
        norm = p.norm_after
        if norm is not None:
            hooks.append(lambda: norm.register_forward_hook(lambda m, a, o: store("norm_out", i, o)))
        return hooks

    registrations: List[Callable[[], Any]] = []
    for i, p in enumerate(parts):
        registrations.extend(layer_registrations(i, p))
    emb = adapter.embed(batch) if embeddings is None else embeddings
    with _hooks(registrations):
        output = adapter.forward_from_embeddings(emb, batch)
    missing = [k for k in ("block_in", "values", "out_proj", "block_out") if any(v is None for v in slots[k])]
    if missing:
        raise ProtocolError(
            f"the traced forward of {type(adapter.model).__name__} did not run every attention "
            f"block's modules (nothing recorded for {missing})."
        )
    return Trace(output, parts, **slots)


def query_positions(adapter: Any, output: ExplainOutput, batch_size: int, length: int, device: Any) -> Tensor:
    """``LongTensor[B]``: the position whose row the classifier reads (the adapter's pooled row)."""
    given = (output.extras or {}).get("query_positions")
    if given is not None:
        return torch.as_tensor(given, device=device).long().view(batch_size)
    q = getattr(adapter, "query_index", 0)
    if q is None:
        raise ValueError(
            f"{type(adapter).__name__} pools several rows (extras['query_mask'], e.g. mean pooling) "
            "and this method reads one row; use query_weights, or set the adapter's query_index."
        )
    return torch.full((batch_size,), int(q) % length, dtype=torch.long, device=device)


def query_weights(adapter: Any, output: ExplainOutput, batch_size: int, length: int, device: Any) -> Tensor:
    """``[B, T]``: the weight of each row in what the classifier reads — one-hot at the pooled row, or uniform
    over the pooled rows of a mean-pooling head (``extras["query_mask"]`` without ``extras["query_positions"]``)."""
    extras = output.extras or {}
    if extras.get("query_positions") is None and extras.get("query_mask") is not None:
        pooled = torch.as_tensor(extras["query_mask"], device=device).view(batch_size, length).float()
        return pooled / pooled.sum(-1, keepdim=True).clamp_min(1.0)
    rows = query_positions(adapter, output, batch_size, length, device)
    return torch.nn.functional.one_hot(rows, length).float()


def head_outputs(parts: LayerParts, values: Tensor) -> Tensor:
    """``[B, T, H, D]``: ``f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h`` for every token and head (``b_O`` excluded)."""
    B, T, _ = values.shape
    v = values.view(B, T, parts.n_kv_heads, parts.head_dim)
    if parts.n_heads != parts.n_kv_heads:  # grouped-query attention: kv head k serves heads k*g .. k*g+g-1
        v = v.repeat_interleave(parts.n_heads // parts.n_kv_heads, dim=2)
    w_o = parts.out.weight.view(parts.out.out_features, parts.n_heads, parts.head_dim).to(v.dtype)
    return torch.einsum("bjhk,dhk->bjhd", v, w_o)


def mix_vectors(parts: LayerParts, values: Tensor, attention: Tensor, rows: Optional[Tensor] = None) -> Tensor:
    """``Σ_h α^h_{ij} f^h(x_j)``: ``[B, T, T, D]`` (query i, key j), or ``[B, T, D]`` for one query row per example."""
    f = head_outputs(parts, values)
    if rows is None:
        return torch.einsum("bhij,bjhd->bijd", attention.to(f.dtype), f)
    picked = attention[torch.arange(attention.shape[0], device=attention.device), :, rows, :]  # [B, H, T]
    return torch.einsum("bhj,bjhd->bjd", picked.to(f.dtype), f)


def _expand(value: Any, batch_size: int, repeats: int) -> Any:
    if isinstance(value, Tensor):
        if value.dim() >= 2 and value.shape[0] == batch_size and batch_size > 1:
            return value.repeat_interleave(repeats, dim=0)
        if value.dim() >= 2 and value.shape[0] == 1:
            return value.expand(repeats * batch_size, *value.shape[1:]) if batch_size == 1 else value
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_expand(v, batch_size, repeats) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return None  # caches and other stateful objects: a re-run must not read or extend them


def rerun_layer(
    tr: Trace, layer: int, hidden: Tensor, repeats: int, value_edit: Optional[Callable[[Tensor], Tensor]] = None
) -> Tensor:
    """Re-run block ``layer`` on ``hidden`` (``[B·repeats, T, D]``, rows of example b at b·repeats ...), with the
    call's other arguments repeated likewise, and ``value_edit`` applied to its value projection's output."""
    parts = tr.parts[layer]
    args, kwargs = tr.calls[layer]
    B = tr.block_in[layer].shape[0]
    new_args = (hidden,) + tuple(_expand(a, B, repeats) for a in args[1:]) if args else ()
    new_kwargs = {k: _expand(v, B, repeats) for k, v in kwargs.items()}
    if not args:
        new_kwargs["hidden_states"] = hidden
    registrations = (
        [] if value_edit is None else [lambda: parts.value.register_forward_hook(lambda m, a, o: value_edit(o))]
    )
    with _hooks(registrations):
        return _first(parts.block(*new_args, **new_kwargs))


def block_tail(parts: LayerParts) -> Optional[Callable[[Tensor, Tensor], Tensor]]:
    """What a block computes after its attention output projection, as ``tail(x, o) -> block output``.

    ``x`` is the block's input (the residual stream), ``o`` the output projection's output (``b_O`` included); both
    ``[..., D]``. Every step is position-wise (residual sums, layer norms, the feed-forward network), so any rows
    can be stacked. From the block's own modules: BERT family ``feed_forward_chunk(LayerNorm(o + x))``, DistilBERT
    ``output_layer_norm(ffn(h) + h)`` with ``h = sa_layer_norm(o + x)``, Llama family ``h + mlp(
    post_attention_layernorm(h))`` with ``h = x + o``. ``None`` for a block without those modules. A family whose
    block adds more (Gemma's norms around the attention and the MLP) has the modules but not this computation: the
    caller must check the tail against the block's recorded output (:func:`tail_reproduces`).
    """
    b: Any = parts.block  # a transformers block: its methods and submodules are the family's own
    if parts.family == "bert" and callable(getattr(b, "feed_forward_chunk", None)):
        norm = parts.norm_after
        assert norm is not None  # the BERT layout is post-LN: its parts always include the norm
        return lambda x, o: b.feed_forward_chunk(norm(o + x))
    if parts.family == "distilbert" and all(hasattr(b, n) for n in ("sa_layer_norm", "ffn", "output_layer_norm")):

        def distil_tail(x: Tensor, o: Tensor) -> Tensor:
            h = b.sa_layer_norm(o + x)
            return b.output_layer_norm(b.ffn(h) + h)

        return distil_tail
    if parts.family == "llama" and all(hasattr(b, n) for n in ("mlp", "post_attention_layernorm")):

        def llama_tail(x: Tensor, o: Tensor) -> Tensor:
            h = x + o
            return h + b.mlp(b.post_attention_layernorm(h))

        return llama_tail
    return None


def tail_reproduces(tr: Trace, layer: int, tail: Callable[[Tensor, Tensor], Tensor]) -> bool:
    """Whether ``tail(block_in, out_proj)`` gives the block's recorded output (relative 1e-4 of its largest value):
    False for a block that computes more than :func:`block_tail` knows, or dropout in training mode."""
    expected = tr.block_out[layer]
    got = tail(tr.block_in[layer], tr.out_proj[layer])
    if got.shape != expected.shape:
        return False
    scale = float(expected.detach().abs().max())
    return float((got.detach() - expected.detach()).abs().max()) <= 1e-4 * scale + 1e-6


def traced_layers(
    model: Any, batch: Batch, target: Any, layer: Optional[int]
) -> Tuple[Trace, Tensor, Tensor, List[int]]:
    """The traced forward, its ``[B, T]`` pad mask, the pooled rows and the layer indices ``layer`` names
    (``None``: every layer, first first), checking ``target`` against the logits: what the rolled-out methods share."""
    tr = trace(model, batch)
    resolve_target(tr.output.logits, target)
    x = tr.block_in[0]
    rows = query_positions(model, tr.output, x.shape[0], x.shape[1], x.device)
    layers = list(range(len(tr.parts))) if layer is None else [layer_index(layer, len(tr.parts))]
    return tr, pad_mask(batch, x), rows, layers


def layer_index(layer: int, n_layers: int) -> int:
    """``layer`` as a non-negative index (negative counts from the top), or a ValueError naming the range."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n_layers <= layer < n_layers:
        raise ValueError(
            f"layer={layer!r} does not exist: the model has {n_layers} attention layers "
            f"(use 0..{n_layers - 1} or -1 for the last)."
        )
    return layer % n_layers


def pad_mask(batch: Batch, like: Tensor) -> Tensor:
    """``[B, T]`` bool: the positions the model reads (``attention_mask``; special tokens included)."""
    if "attention_mask" not in batch:
        return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
    return batch["attention_mask"].to(like.device).bool()


def normalise_rows(matrix: Tensor, present: Tensor) -> Tensor:
    """``[B, T, T]`` with pad rows/columns zeroed and every other row divided by its sum (0 stays 0)."""
    keep = present.unsqueeze(1) & present.unsqueeze(2)
    matrix = matrix.masked_fill(~keep, 0.0)
    return matrix / matrix.sum(-1, keepdim=True).clamp_min(torch.finfo(matrix.dtype).tiny)


def rollout_rows(matrices: List[Tensor], rows: Tensor) -> Tensor:
    """``[B, T]``: row ``rows[b]`` of ``M_L ⋯ M_1`` (``M_l`` ``[B, T, T]``, first layer first)."""
    joint = matrices[0]
    for m in matrices[1:]:
        joint = m @ joint
    return joint[torch.arange(joint.shape[0], device=joint.device), rows]


def adapter_model(model: Any) -> nn.Module:
    """The wrapped ``transformers`` model of a :class:`~lightning_xai.adapters.HuggingFaceAdapter`."""
    inner = getattr(model, "model", None)
    if not isinstance(inner, nn.Module) or not hasattr(inner, "config"):
        raise ProtocolError(
            f"{type(model).__name__} is not a HuggingFaceAdapter: the context-mixing methods read a "
            "transformers model's attention blocks; wrap the classifier with "
            "lightning_xai.adapters.HuggingFaceAdapter(model)."
        )
    if isinstance(model, TargetSequence):  # a causal LM, or an encoder–decoder (whose blocks no layout describes)
        raise ProtocolError(
            f"the context-mixing methods do not explain generators: {type(inner).__name__} (model_type="
            f"{getattr(inner.config, 'model_type', None)!r}) explains target log-probabilities, which each step "
            "reads through its own query row (a decoder's self-attention or cross-attention), while these methods "
            "decompose the one pooled row of a classifier through self-attention blocks. Use 'attention', a "
            "gradient method, 'integrated_gradients', 'smooth_grad', 'leave_one_out' or 'smooth_attention'."
        )
    return inner

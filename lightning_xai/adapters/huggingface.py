"""See a Hugging Face ``transformers`` sequence classifier through the :class:`ExplainableModel` protocol.

How the protocol maps onto a transformer (BERT family first; nothing below is BERT-specific except the
default position of the summary token):

* ``embed(batch)`` is the model's *input word embedding* of ``batch["input_ids"]`` (``model.get_input_embeddings()``),
  ``[B, T, E]``. Position and token-type embeddings, the embedding LayerNorm and dropout are added *inside* the
  model, which is run with ``inputs_embeds=`` — so a gradient or an Integrated-Gradients path w.r.t. ``embed``'s
  output is exactly Captum's ``LayerIntegratedGradients`` on the word-embedding layer.
* ``forward_from_embeddings`` runs the model with every layer's attention probabilities recorded
  (``raw_attentions``: one ``[B, heads, T, T]`` tensor per layer) and reduces them to one ``[B, T]`` token
  distribution (``attention``), chosen by the ``attention=`` argument:

  - ``"cls_last_mean"`` (default): the last layer's ``[CLS]`` query row, averaged over heads;
  - ``"cls_last_max"``: the same row, maximum over heads;
  - ``"L:H"`` (e.g. ``"-1:3"``, ``"5:0"``): the ``[CLS]`` row of head ``H`` of layer ``L``; ``H`` may also be
    ``mean`` or ``max``;
  - ``"rollout"``: attention rollout (Abnar & Zuidema, 2020): per layer ``Â_l = (mean_h A_l + I) / 2`` with rows
    renormalised to 1, ``R = Â_L ⋯ Â_1``, the ``[CLS]`` row of ``R``;
  - a callable ``f(raw_attentions, batch) -> [B, T]`` non-negative scores.

  **Renormalisation over real tokens.** Every reduction is set to 0 on ``[CLS]``, ``[SEP]`` and pads and divided by
  its sum over the real tokens: ``a_i / Σ_{j real} a_j``. This is the distribution of the ``[CLS]`` query's
  attention *conditional on not attending to a special token* (BERT puts much of its mass on ``[SEP]``); it is what
  the metrics compare with saliency maps, which also live on real tokens only. The raw rows (with the special
  tokens' mass) stay available in ``raw_attentions`` and ``extras["cls_rows"]``.
* ``attention_override`` replaces the **last layer's ``[CLS]`` query row** of the attention probabilities, for every
  head, before they multiply the values. The sequence classifier reads only the last layer's ``[CLS]`` state, so this
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

  The override goes through a custom attention function registered in transformers' attention-interface registry
  (``AttentionInterface.register`` and ``AttentionMaskInterface.register`` under the name
  :data:`ATTENTION_IMPLEMENTATION`). It calls the model's own eager attention and, only inside an override call and
  only for the last attention module, swaps the row and recomputes ``weights @ values`` (the override row gets no
  attention dropout in train mode). Outside an override it *is* eager attention, so the adapter switches the model
  to it (a model on ``sdpa``/flash attention returns no attention maps: the adapter switches with a warning).
"""
from __future__ import annotations

import contextvars
import importlib
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput, ProtocolError

__all__ = ["ATTENTION_IMPLEMENTATION", "HuggingFaceAdapter", "attention_rollout", "register_attention_implementation"]

#: The name under which lightning_xai's attention function is registered with transformers.
ATTENTION_IMPLEMENTATION = "lightning_xai_eager"

Reduction = Union[str, Callable[[Tuple[Tensor, ...], Batch], Tensor]]


@dataclass
class _Override:
    module: nn.Module
    query_index: int
    make_rows: Callable[[Tensor], Tensor]  # own rows [B, H, T] -> new rows [B, H, T]


_ACTIVE_OVERRIDE: contextvars.ContextVar[Optional[_Override]] = contextvars.ContextVar(
    "lightning_xai_attention_override", default=None)
_EAGER_CACHE: Dict[type, Callable] = {}


def _eager_for(module: nn.Module) -> Callable:
    """The eager attention function of the module's own modeling file (BERT's when it has none)."""
    cls = type(module)
    if cls not in _EAGER_CACHE:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if not callable(fn):
            fn = importlib.import_module("transformers.models.bert.modeling_bert").eager_attention_forward
        _EAGER_CACHE[cls] = fn
    return _EAGER_CACHE[cls]


def _lightning_xai_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Optional[Tensor], scaling: Optional[float] = None,
                             dropout: float = 0.0, **kwargs: Any) -> Tuple[Tensor, Tensor]:
    """Eager attention; inside an override, the target module's query row is replaced and ``weights @ v`` redone."""
    output, weights = _eager_for(module)(module, query, key, value, attention_mask, scaling=scaling,
                                         dropout=dropout, **kwargs)
    state = _ACTIVE_OVERRIDE.get()
    if state is None or state.module is not module:
        return output, weights
    q = state.query_index
    rows = state.make_rows(weights[:, :, q, :]).to(weights.dtype)
    if rows.shape != weights[:, :, q, :].shape:
        raise ValueError(f"attention override rows have shape {tuple(rows.shape)}; the layer's rows are "
                         f"{tuple(weights[:, :, q, :].shape)}.")
    weights = torch.cat([weights[:, :, :q], rows.unsqueeze(2), weights[:, :, q + 1:]], dim=2)
    if value.shape[1] != weights.shape[1]:  # grouped-query attention: share each key/value head
        value = value.repeat_interleave(weights.shape[1] // value.shape[1], dim=1)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


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
        raise ImportError("HuggingFaceAdapter needs `transformers` with AttentionInterface and "
                          "AttentionMaskInterface (transformers >= 4.53): pip install 'lightning-xai[hf]'.") from error
    AttentionInterface.register(ATTENTION_IMPLEMENTATION, _lightning_xai_attention)
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, eager_mask)
    return ATTENTION_IMPLEMENTATION


def attention_rollout(raw_attentions: Sequence[Tensor], query_index: Optional[int] = 0) -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020).

    Per layer the heads are averaged and the residual connection is added as an identity,
    ``Â_l = (mean_h A_l + I) / 2`` with every row renormalised to sum to 1; the layers are composed as
    ``R = Â_L Â_{L-1} ⋯ Â_1`` (``R[i, j]``: how much of input token ``j`` reaches position ``i`` at the top).

    Args:
        raw_attentions: per-layer ``[B, heads, T, T]`` probabilities, first layer first.
        query_index: the row to return (0 = ``[CLS]``); ``None`` returns the whole ``[B, T, T]`` matrix.

    Returns:
        ``[B, T]`` (or ``[B, T, T]``) rollout; rows sum to 1 over all positions (special tokens included).

    Example:
        >>> import torch
        >>> A = torch.tensor([[[[0.5, 0.5], [0.0, 1.0]]]])   # 1 layer, 1 head, 2 tokens
        >>> attention_rollout([A])
        tensor([[0.7500, 0.2500]])
    """
    if not raw_attentions:
        raise ValueError("attention_rollout needs at least one layer of attention probabilities.")
    rollout: Optional[Tensor] = None
    for layer in raw_attentions:
        if layer.dim() != 4 or layer.shape[-1] != layer.shape[-2]:
            raise ValueError(f"each layer must be [B, heads, T, T]; got {tuple(layer.shape)}.")
        mixed = layer.mean(dim=1)
        eye = torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        mixed = (mixed + eye) / 2
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
    assert rollout is not None
    return rollout if query_index is None else rollout[:, query_index, :]


def _renormalise(scores: Tensor, mask: Tensor) -> Tensor:
    scores = scores.masked_fill(~mask, 0.0)
    total = scores.sum(dim=-1, keepdim=True)
    return scores / total.clamp_min(torch.finfo(scores.dtype).tiny)


class HuggingFaceAdapter(nn.Module):
    """A ``transformers`` sequence classifier seen through the :class:`ExplainableModel` protocol.

    Batches are dicts with ``input_ids`` and ``attention_mask`` ``[B, T]`` (plus ``token_type_ids`` if the model
    uses them) and, ideally, ``mask``: True at real word-pieces (not ``[CLS]``/``[SEP]``/pad) — what
    :class:`lightning_xai.data.hf.WordPieceCollator` produces. Without ``mask`` the token mask is
    ``attention_mask`` minus the tokenizer's special tokens (a ``tokenizer`` is then required).

    The module is an ``nn.Module`` holding the model (``adapter.model``): ``.eval()``, ``.to()``, ``.parameters()``
    act on the model. Constructing it switches the model to lightning_xai's registered eager attention (see the
    module docstring; a warning is issued when the model was on ``sdpa``/flash attention).

    Args:
        model: a ``PreTrainedModel`` for sequence classification (``AutoModelForSequenceClassification``).
        tokenizer: its tokenizer; used to check that ids fit the model's vocabulary and to find special tokens.
        attention: the reduction reported as ``ExplainOutput.attention`` (see the module docstring).
        override_specials: ``"keep"`` or ``"zero"``: what a ``[B, T]`` override does with each head's mass on the
            special tokens.
        query_index: position of the summary token whose row is reduced/overridden (0 for BERT's ``[CLS]``).

    Raises:
        ProtocolError: no reachable input embedding layer, or attention not dispatched through transformers'
            attention interface.
        ValueError: tokenizer/model vocabulary mismatch, unknown reduction.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> _ = torch.manual_seed(0)
        >>> config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
        ...                     intermediate_size=16, max_position_embeddings=16, attn_implementation="eager")
        >>> adapter = HuggingFaceAdapter(BertForSequenceClassification(config).eval())
        >>> batch = {"input_ids": torch.tensor([[2, 7, 8, 3, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 1, 0]]),
        ...          "mask": torch.tensor([[False, True, True, False, False]])}
        >>> out = adapter(batch)
        >>> out.logits.shape, len(out.raw_attentions), out.raw_attentions[-1].shape
        (torch.Size([1, 2]), 2, torch.Size([1, 2, 5, 5]))
        >>> out.attention.sum().item(), out.attention[0, [0, 3, 4]].tolist()
        (1.0, [0.0, 0.0, 0.0])
        >>> again = adapter(batch, attention_override=out.extras["cls_rows"])
        >>> torch.equal(again.logits, out.logits)
        True
    """

    def __init__(self, model: nn.Module, tokenizer: Any = None, attention: Reduction = "cls_last_mean",
                 override_specials: str = "keep", query_index: int = 0) -> None:
        super().__init__()
        if override_specials not in ("keep", "zero"):
            raise ValueError(f"override_specials must be 'keep' or 'zero', got {override_specials!r}.")
        self.model = model
        self.tokenizer = tokenizer
        self.override_specials = override_specials
        self.query_index = query_index
        self._reduce = self._parse_reduction(attention)
        self.attention_name = attention if isinstance(attention, str) else getattr(attention, "__name__", "callable")
        # a reference, not a registered submodule: it already lives inside ``model`` (no duplicate state_dict keys)
        object.__setattr__(self, "_embedding", self._find_embedding(model))
        self._check_tokenizer(tokenizer)
        self._use_registered_attention(model)
        object.__setattr__(self, "_attention_modules", self._find_attention_modules(model))

    # --- construction checks ------------------------------------------------------------------------------
    @staticmethod
    def _find_embedding(model: nn.Module) -> nn.Embedding:
        getter = getattr(model, "get_input_embeddings", None)
        embedding = None
        if callable(getter):
            try:
                embedding = getter()
            except (NotImplementedError, AttributeError):
                embedding = None
        if not isinstance(embedding, nn.Embedding):
            raise ProtocolError(
                f"{type(model).__name__} has no reachable input embedding layer (get_input_embeddings() returned "
                f"{type(embedding).__name__}). HuggingFaceAdapter needs an nn.Embedding it can call on input_ids and "
                "a forward accepting inputs_embeds; for other models use HookAdapter(module, embedding='<name>', "
                "attention='<name>').")
        return embedding

    def _check_tokenizer(self, tokenizer: Any) -> None:
        if tokenizer is None:
            return
        rows = self._embedding.num_embeddings
        size = len(tokenizer)
        if size > rows:
            raise ValueError(f"Tokenizer/model mismatch: the tokenizer has {size} tokens but the model's embedding "
                             f"table has {rows} rows; load the tokenizer that belongs to this checkpoint (or call "
                             "model.resize_token_embeddings(len(tokenizer)) after adding tokens).")
        config = getattr(self.model, "config", None)
        for name in ("pad_token_id", "cls_token_id", "sep_token_id"):
            mine, theirs = getattr(tokenizer, name, None), getattr(config, name, None)
            if mine is not None and theirs is not None and mine != theirs:
                raise ValueError(f"Tokenizer/model mismatch: tokenizer.{name}={mine} but model.config.{name}="
                                 f"{theirs}; load the tokenizer that belongs to this checkpoint.")

    @staticmethod
    def _use_registered_attention(model: nn.Module) -> None:
        config = getattr(model, "config", None)
        current = getattr(config, "_attn_implementation", None)
        register_attention_implementation()  # also when a saved config already names it (new process)
        if current == ATTENTION_IMPLEMENTATION:
            return
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
                "class that supports attn_implementation switching, or HookAdapter on its attention modules.")
        if current not in (None, "eager"):
            warnings.warn(f"{type(model).__name__} used attn_implementation={current!r}, which returns no attention "
                          f"maps; switched it to lightning_xai's eager attention ({ATTENTION_IMPLEMENTATION!r}). "
                          "Load it with attn_implementation='eager' to avoid this message.", stacklevel=3)

    @staticmethod
    def _find_attention_modules(model: nn.Module) -> List[nn.Module]:
        recorders = getattr(model, "_can_record_outputs", None) or {}
        target = recorders.get("attentions") if isinstance(recorders, dict) else None
        target = getattr(target, "target_class", target)
        if isinstance(target, type):
            modules = [m for m in model.modules() if isinstance(m, target)]
            if modules:
                return modules
        return []

    def _parse_reduction(self, attention: Reduction) -> Callable[[Tuple[Tensor, ...], Batch], Tensor]:
        q = self.query_index
        if callable(attention):
            return attention
        if not isinstance(attention, str):
            raise ValueError(f"attention must be a string or a callable, got {type(attention).__name__}.")
        if attention == "cls_last_mean":
            return lambda raw, batch: raw[-1][:, :, q, :].mean(dim=1)
        if attention == "cls_last_max":
            return lambda raw, batch: raw[-1][:, :, q, :].amax(dim=1)
        if attention == "rollout":
            return lambda raw, batch: attention_rollout(raw, q)
        if ":" in attention:
            layer_text, head_text = attention.split(":", 1)
            try:
                layer = int(layer_text)
            except ValueError:
                layer = None
            if layer is not None and head_text in ("mean", "max"):
                pool = (lambda rows: rows.mean(dim=1)) if head_text == "mean" else (lambda rows: rows.amax(dim=1))
                return lambda raw, batch: pool(self._layer(raw, layer)[:, :, q, :])
            if layer is not None and head_text.lstrip("-").isdigit():
                head = int(head_text)
                return lambda raw, batch: self._head(self._layer(raw, layer), head)[:, q, :]
        raise ValueError(f"Unknown attention reduction {attention!r}; use 'cls_last_mean', 'cls_last_max', "
                         "'rollout', 'LAYER:HEAD' (e.g. '-1:0', '5:mean') or a callable f(raw_attentions, batch).")

    @staticmethod
    def _layer(raw: Tuple[Tensor, ...], layer: int) -> Tensor:
        if not -len(raw) <= layer < len(raw):
            raise ValueError(f"attention layer {layer} does not exist: the model has {len(raw)} layers.")
        return raw[layer]

    @staticmethod
    def _head(layer: Tensor, head: int) -> Tensor:
        if not -layer.shape[1] <= head < layer.shape[1]:
            raise ValueError(f"attention head {head} does not exist: the layer has {layer.shape[1]} heads.")
        return layer[:, head]

    # --- the ExplainableModel protocol -----------------------------------------------------------------------
    @property
    def pad_token_id(self) -> Optional[int]:
        """The pad id (tokenizer's, else the model config's): the "pad" baseline of IG and leave-one-out."""
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return pad if pad is not None else getattr(getattr(self.model, "config", None), "pad_token_id", None)

    @property
    def max_length(self) -> Optional[int]:
        """The longest sequence the model's position embeddings allow (``None`` if unknown)."""
        return getattr(getattr(self.model, "config", None), "max_position_embeddings", None)

    def embed(self, batch: Batch) -> Tensor:
        """``[B, T, E]`` word embeddings of ``batch["input_ids"]`` (graph-connected to the embedding table)."""
        if "input_ids" not in batch:
            raise KeyError("Batch has no 'input_ids'; HF batches need input_ids and attention_mask "
                           "(see lightning_xai.data.hf.WordPieceCollator).")
        ids = batch["input_ids"]
        rows = self._embedding.num_embeddings
        if ids.numel() and (int(ids.max()) >= rows or int(ids.min()) < 0):
            raise ValueError(f"Tokenizer/model mismatch: input_ids contain id {int(ids.max())} but the model's "
                             f"embedding table has {rows} rows; tokenize with this checkpoint's tokenizer.")
        limit = self.max_length
        if limit is not None and ids.shape[1] > limit:
            raise ValueError(f"Sequences of {ids.shape[1]} word-pieces exceed the model's max length {limit}; "
                             "tokenize with truncation (WordPieceCollator(max_length=...) truncates with a warning "
                             "that counts the rationale/impermissible words cut off).")
        return self._embedding(ids)

    def token_mask(self, batch: Batch) -> Tensor:
        """``[B, T]`` bool: real word-pieces (``batch["mask"]``, else attention_mask minus special tokens)."""
        if "mask" in batch:
            mask = batch["mask"]
            if mask.dtype != torch.bool:
                raise TypeError(f"'mask' must be a bool tensor, got {mask.dtype}; use mask.bool().")
            return mask
        if self.tokenizer is None:
            raise KeyError("Batch has no 'mask' (real word-pieces) and the adapter has no tokenizer to find the "
                           "special tokens; pass tokenizer= or collate with lightning_xai.data.hf.WordPieceCollator.")
        special = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), device=batch["input_ids"].device)
        return self._attention_mask(batch).bool() & ~torch.isin(batch["input_ids"], special)

    @staticmethod
    def _attention_mask(batch: Batch) -> Tensor:
        if "attention_mask" not in batch:
            raise KeyError("Batch has no 'attention_mask' (1 at every non-pad position, special tokens included); "
                           "collate with lightning_xai.data.hf.WordPieceCollator or the tokenizer's padding.")
        return batch["attention_mask"]

    def _override_rows(self, override: Tensor, batch: Batch, mask: Tensor) -> Callable[[Tensor], Tensor]:
        attention_mask = self._attention_mask(batch).bool()
        B, T = mask.shape
        if override.dim() == 2:
            if override.shape != (B, T):
                raise ValueError(f"attention_override has shape {tuple(override.shape)}; expected the token mask's "
                                 f"{(B, T)} (or [B, heads, T] raw rows).")
            real = override.masked_fill(~mask, 0.0)

            def make_rows(own: Tensor) -> Tensor:
                proposal = real.unsqueeze(1).to(own.dtype).expand_as(own)
                if self.override_specials == "zero":
                    return proposal
                special = (attention_mask & ~mask).unsqueeze(1)
                kept = own * special
                return kept + proposal * (1 - kept.sum(dim=-1, keepdim=True))

            return make_rows
        if override.dim() == 3:
            if override.shape[0] != B or override.shape[2] != T:
                raise ValueError(f"attention_override has shape {tuple(override.shape)}; expected [B, heads, T] = "
                                 f"[{B}, heads, {T}] raw rows (or the token mask's [B, T]).")

            def make_rows(own: Tensor) -> Tensor:
                if override.shape[1] != own.shape[1]:
                    raise ValueError(f"attention_override has {override.shape[1]} heads; the last layer has "
                                     f"{own.shape[1]}.")
                return override.to(own.dtype) * attention_mask.unsqueeze(1).to(own.dtype)

            return make_rows
        raise ValueError(f"attention_override must be [B, T] or [B, heads, T]; got {tuple(override.shape)}.")

    def forward_from_embeddings(self, embeddings: Tensor, batch: Batch, *,
                                attention_override: Optional[Tensor] = None) -> ExplainOutput:
        """Run the classifier from word embeddings (see the module docstring for the override semantics)."""
        mask = self.token_mask(batch)
        if embeddings.shape[:2] != mask.shape:
            raise ValueError(f"embeddings have shape {tuple(embeddings.shape)} but the token mask is "
                             f"{tuple(mask.shape)}; expected [B, T, E] with the batch's [B, T].")
        kwargs = {"inputs_embeds": embeddings, "attention_mask": self._attention_mask(batch),
                  "output_attentions": True, "output_hidden_states": True, "return_dict": True}
        if "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"]
        token = None
        if attention_override is not None:
            if not self._attention_modules:
                raise ProtocolError(f"{type(self.model).__name__} does not declare its attention modules "
                                    "(_can_record_outputs['attentions']), so attention_override cannot find the last "
                                    "layer; use HookAdapter for this model.")
            state = _Override(self._attention_modules[-1], self.query_index,
                              self._override_rows(attention_override, batch, mask))
            token = _ACTIVE_OVERRIDE.set(state)
        try:
            output = self.model(**kwargs)
        finally:
            if token is not None:
                _ACTIVE_OVERRIDE.reset(token)
        raw = tuple(output.attentions) if getattr(output, "attentions", None) is not None else ()
        if not raw:
            raise ProtocolError(
                f"{type(self.model).__name__} returned no attention maps (attn_implementation="
                f"{getattr(self.model.config, '_attn_implementation', None)!r}); load it with "
                "attn_implementation='eager'.")
        reduced = self._reduce(raw, batch)
        if reduced.shape != mask.shape:
            raise ValueError(f"the attention reduction returned shape {tuple(reduced.shape)}; expected "
                             f"{tuple(mask.shape)}.")
        attention = _renormalise(reduced, mask)
        hidden = output.hidden_states[-1] if getattr(output, "hidden_states", None) else None
        return ExplainOutput(logits=output.logits, attention=attention, hidden_states=hidden, raw_attentions=raw,
                             extras={"cls_rows": raw[-1][:, :, self.query_index, :],
                                     "all_hidden_states": getattr(output, "hidden_states", None)})

    def forward(self, batch: Batch, attention_override: Optional[Tensor] = None) -> ExplainOutput:
        """``forward_from_embeddings(embed(batch), batch, attention_override=...)``."""
        return self.forward_from_embeddings(self.embed(batch), batch, attention_override=attention_override)

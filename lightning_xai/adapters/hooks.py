"""See any ``nn.Module`` through the :class:`ExplainableModel` protocol by naming two of its submodules.

:class:`HookAdapter` needs only the (dotted) names of

* the **embedding** module: its output ``[B, T, E]`` is what ``embed`` returns and what
  ``forward_from_embeddings`` substitutes (a forward hook replaces the module's output with the given embeddings,
  so everything after it — positional encodings, encoders — runs unchanged and stays differentiable);
* the **attention** module, whose *output* is the attention distribution the network consumes (typically a softmax
  module); a hook captures it and, for an override, replaces it. Hooks live for one call. Its output may be

* ``[B, T]`` token weights (additive/dot attention over a sequence), or
* ``[B, heads, T, T]`` self-attention probabilities: the reported attention is the pooled query row (see *Which
  query row* below) averaged over heads, and an override replaces the pooled row(s) for all heads.

If the module returns a tuple, ``attention_index`` says which element holds the weights. The reported
``attention`` is 0 outside the token mask and renormalised to sum to 1 over real tokens (as in
:class:`~lightning_xai.adapters.HuggingFaceAdapter`); an override is used as given, 0 outside the token mask.

**PyTorch's own attention modules work unchanged**: name an ``nn.MultiheadAttention`` or an
``nn.TransformerEncoderLayer`` (its ``self_attn`` is used). For the adapter's passes only, the module runs with
``need_weights=True, average_attn_weights=False`` on PyTorch's slow path, and an override recomputes the pooled
rows' outputs from the module's value and output projections; afterwards the fast path and the module are
exactly as before (:mod:`lightning_xai.adapters.torch_attention`).

Other modules that return only the mixed values cannot be overridden by a hook: name the submodule that produces
the weights (a softmax module), or use :class:`HuggingFaceAdapter` for ``transformers`` models.

**Which query row** (self-attention only): the reported attention is what the classifier reads, so say where it
pools — ``pooling="first"`` (row 0, a ``[CLS]`` token), ``pooling="mean"`` (the classifier averages the hidden
states over the real tokens: the reported attention is the mean of the head-averaged query rows over the real
tokens of the token mask, and an override replaces every real token's row, so that mean is the override), or
``query_index=k`` (row ``k`` of every example). There is no default: a guess would silently describe another row.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

from lightning_xai.adapters.checks import check_token_ids
from lightning_xai.adapters.protocol import Batch, ExplainOutput, ProtocolError, check_embeddings
from lightning_xai.adapters.torch_attention import MultiheadHooks, multihead_attention_of, pooled_rows, slow_attention

__all__ = ["HookAdapter"]


def _default_forward(module: nn.Module, batch: Batch) -> Any:
    return module(batch["input_ids"])


def _logits_of(result: Any) -> Tensor:
    if isinstance(result, Tensor):
        return result
    if hasattr(result, "logits"):
        return result.logits
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], Tensor):
        return result[0]
    if isinstance(result, dict) and "logits" in result:
        return result["logits"]
    raise ProtocolError(
        f"The model returned {type(result).__name__}; HookAdapter needs logits: a tensor, a tuple "
        "whose first element is the logits, or an object/dict with 'logits'. Pass logits_fn=."
    )


class HookAdapter(nn.Module):
    """Explain any ``nn.Module`` by naming its embedding and attention submodules (forward hooks).

    Args:
        module: the model.
        embedding: dotted name of the module whose output is the ``[B, T, E]`` input embeddings.
        attention: dotted name of the module whose output is the attention distribution, or of an
            ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` (used unchanged, see the module docstring).
        forward_fn: ``forward_fn(module, batch)`` runs the model on a batch; default ``module(batch["input_ids"])``.
        embedding_input: ``embedding_input(batch)`` is what the embedding module is called on in ``embed``;
            default ``batch["input_ids"]``.
        logits_fn: extracts the logits from the model's return value (default: the tensor itself, ``.logits``, or a
            tuple's first element).
        mask_key: batch key of the ``[B, T]`` bool token mask (real tokens).
        attention_index: element of a tuple output holding the weights (``None``: the output is the weights).
        hidden: optional dotted name of a module whose ``[B, T, H]`` output is reported as ``hidden_states``.
        pooling: for self-attention, where the classifier reads: ``"first"`` (row 0, ``[CLS]``) or ``"mean"`` (the
            mean over the token mask's real tokens); see the module docstring.
        query_index: for self-attention, an explicit query row instead of ``pooling`` (negative counts from the
            end). Self-attention needs one of the two; ``[B, T]`` attention needs neither.

    Example — a user-style model (GRU encoder, additive attention in its own softmax module):

        >>> import torch
        >>> from torch import nn
        >>> class MaskedSoftmax(nn.Module):
        ...     def forward(self, scores, mask):
        ...         return scores.masked_fill(~mask, float("-inf")).softmax(-1)
        >>> class UserModel(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.emb = nn.Embedding(50, 8)
        ...         self.rnn = nn.GRU(8, 8, batch_first=True)
        ...         self.score = nn.Linear(8, 1)
        ...         self.attn = MaskedSoftmax()
        ...         self.out = nn.Linear(8, 2)
        ...     def forward(self, ids, mask):
        ...         h, _ = self.rnn(self.emb(ids))
        ...         a = self.attn(self.score(h).squeeze(-1), mask)
        ...         return self.out(torch.einsum("bt,bth->bh", a, h))
        >>> _ = torch.manual_seed(0)
        >>> adapter = HookAdapter(UserModel(), embedding="emb", attention="attn",
        ...                       forward_fn=lambda m, b: m(b["input_ids"], b["mask"]))
        >>> batch = {"input_ids": torch.tensor([[4, 9, 7, 0]]), "mask": torch.tensor([[True, True, True, False]])}
        >>> out = adapter(batch)
        >>> out.attention.shape, round(out.attention.sum().item(), 6), out.attention[0, 3].item()
        (torch.Size([1, 4]), 1.0, 0.0)
        >>> uniform = batch["mask"].float() / 3
        >>> torch.allclose(adapter(batch, attention_override=out.attention).logits, out.logits)
        True
        >>> torch.allclose(adapter(batch, attention_override=uniform).logits, out.logits)
        False
        >>> adapter.probe(batch)   # what the audit callbacks run once before their first audit: passes

    Example — a textbook ``nn.TransformerEncoder`` classifier, unchanged (mean pooling over real tokens):

        >>> class Encoder(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.emb = nn.Embedding(50, 8)
        ...         layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
        ...         self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        ...         self.out = nn.Linear(8, 2)
        ...     def forward(self, ids, mask):
        ...         h = self.encoder(self.emb(ids), src_key_padding_mask=~mask)
        ...         return self.out((h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True))
        >>> adapter = HookAdapter(Encoder().eval(), embedding="emb", attention="encoder.layers.1", pooling="mean",
        ...                       forward_fn=lambda m, b: m(b["input_ids"], b["mask"]))
        >>> out = adapter(batch)
        >>> round(out.attention.sum().item(), 6), out.raw_attentions[0].shape
        (1.0, torch.Size([1, 2, 4, 4]))
        >>> adapter.probe(batch)
    """

    # references to submodules of ``module``, set with object.__setattr__ (not registered: no duplicate state_dict
    # keys); declared here because nn.Module's __getattr__ types unknown attributes as Tensor | Module
    _embedding: nn.Module
    _attention: nn.Module
    _hidden: Optional[nn.Module]
    _multihead: Optional[nn.MultiheadAttention]

    def __init__(
        self,
        module: nn.Module,
        embedding: str,
        attention: str,
        *,
        forward_fn: Optional[Callable[[nn.Module, Batch], Any]] = None,
        embedding_input: Optional[Callable[[Batch], Any]] = None,
        logits_fn: Optional[Callable[[Any], Tensor]] = None,
        mask_key: str = "mask",
        attention_index: Optional[int] = None,
        hidden: Optional[str] = None,
        pooling: Optional[str] = None,
        query_index: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.embedding_name, self.attention_name, self.hidden_name = embedding, attention, hidden
        # references, not registered submodules: they live inside ``module`` (no duplicate state_dict keys)
        object.__setattr__(self, "_embedding", self._submodule(embedding, "embedding"))
        object.__setattr__(self, "_attention", self._submodule(attention, "attention"))
        object.__setattr__(self, "_hidden", self._submodule(hidden, "hidden") if hidden is not None else None)
        object.__setattr__(self, "_multihead", multihead_attention_of(self._attention, attention))
        if self._multihead is not None and attention_index not in (None, 1):
            raise ProtocolError(
                f"HookAdapter: {attention!r} is PyTorch attention, whose weights the adapter reads "
                "itself (element 1 of its output); leave attention_index=None."
            )
        if pooling not in (None, "first", "mean"):
            raise ValueError(
                f"HookAdapter(pooling={pooling!r}): use 'first' (row 0, [CLS]), 'mean' (the mean of "
                "the real tokens' rows), or query_index=<row> for another row."
            )
        if pooling is not None and query_index is not None:
            raise ValueError(
                f"HookAdapter: pooling={pooling!r} and query_index={query_index} both say which row "
                "the classifier reads; pass one."
            )
        self.forward_fn = forward_fn or _default_forward
        self.embedding_input = embedding_input or (lambda batch: batch["input_ids"])
        self.logits_fn = logits_fn or _logits_of
        self.mask_key = mask_key
        self.attention_index = attention_index
        #: where the classifier reads self-attention: "first", "mean", "index" (``query_index``) or None (not said)
        self.pooling = "index" if query_index is not None else pooling
        #: the one query row read (0 for "first"); None for mean pooling
        self.query_index = 0 if pooling == "first" else query_index

    def _submodule(self, name: str, role: str) -> nn.Module:
        try:
            return self.module.get_submodule(name)
        except AttributeError:
            names = [n for n, _ in self.module.named_modules() if n]
            raise ProtocolError(
                f"HookAdapter: {type(self.module).__name__} has no submodule {name!r} (the {role} "
                f"module). Its submodules are: {', '.join(names[:40])}"
                f"{' ...' if len(names) > 40 else ''}."
            ) from None

    # --- the ExplainableModel protocol -----------------------------------------------------------------------
    def token_mask(self, batch: Batch) -> Tensor:
        if self.mask_key not in batch:
            raise KeyError(
                f"Batch has no {self.mask_key!r} (bool [B, T], True at real tokens); HookAdapter needs it "
                "(set mask_key= if your batches call it something else)."
            )
        mask = batch[self.mask_key]
        if mask.dtype != torch.bool:
            raise TypeError(f"{self.mask_key!r} must be a bool tensor, got {mask.dtype}; use .bool().")
        return mask

    def embed(self, batch: Batch) -> Tensor:
        inputs = self.embedding_input(batch)
        if isinstance(self._embedding, nn.Embedding) and isinstance(inputs, Tensor):
            check_token_ids(inputs, self._embedding.num_embeddings, f"the ids fed to {self.embedding_name!r}")
        out = self._embedding(inputs)
        if not isinstance(out, Tensor) or out.dim() != 3:
            raise ProtocolError(
                f"HookAdapter: the embedding module {self.embedding_name!r} returned "
                f"{getattr(out, 'shape', type(out))}; it must return [B, T, E] embeddings."
            )
        return out

    def _weights(self, output: Any) -> Tensor:
        weights = output if self.attention_index is None else output[self.attention_index]
        if not isinstance(weights, Tensor):
            raise ProtocolError(
                f"HookAdapter: the attention module {self.attention_name!r} returned "
                f"{type(output).__name__}; set attention_index= to the element holding the weights."
            )
        return weights

    def _replace(self, output: Any, weights: Tensor) -> Any:
        if self.attention_index is None:
            return weights
        items = list(output)
        items[self.attention_index] = weights
        return type(output)(items) if isinstance(output, tuple) else items

    def _rows(self, weights: Tensor, mask: Tensor) -> Tensor:
        """``[B, T]`` weight of each query row in what the classifier reads (self-attention ``weights``)."""
        if self.pooling is None:
            raise ProtocolError(
                f"HookAdapter: the attention module {self.attention_name!r} gives self-attention "
                f"{tuple(weights.shape)} ([B, heads, T, T]): say which query row the classifier reads — "
                "pooling='first' (row 0, [CLS]), pooling='mean' (the mean over the real tokens), or query_index=<row>."
            )
        if weights.shape[-1] != mask.shape[-1] or weights.shape[-2] != mask.shape[-1]:
            raise ProtocolError(
                f"HookAdapter: attention weights of shape {tuple(weights.shape)} but the token mask "
                f"is {tuple(mask.shape)}; expected [B, heads, T, T]."
            )
        return pooled_rows(self.pooling, self.query_index, mask.to(weights.device)).to(weights.dtype)

    def _override(self, weights: Tensor, override: Tensor, mask: Tensor) -> Tensor:
        """``weights`` with the pooled row(s) replaced by ``override`` for every head."""
        if weights.dim() == 2:
            return override
        if weights.dim() == 4:
            rows = self._rows(weights, mask) > 0
            return torch.where(rows[:, None, :, None], override[:, None, None, :].expand_as(weights), weights)
        raise ProtocolError(
            f"HookAdapter: cannot override attention weights of shape {tuple(weights.shape)}; "
            "expected [B, T] or [B, heads, T, T]."
        )

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        mask = self.token_mask(batch)
        check_embeddings(embeddings, mask)
        if attention_override is not None and attention_override.shape != mask.shape:
            raise ValueError(
                f"attention_override has shape {tuple(attention_override.shape)}; expected the token "
                f"mask's {tuple(mask.shape)}."
            )
        captured: Dict[str, Any] = {}
        calls: List[int] = []

        def on_embedding(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            if output.shape != embeddings.shape:
                raise ProtocolError(
                    f"HookAdapter: the embedding module {self.embedding_name!r} produced "
                    f"{tuple(output.shape)} inside the forward pass but the embeddings given have "
                    f"{tuple(embeddings.shape)}."
                )
            return embeddings

        def overridden(weights: Tensor) -> Tensor:
            assert attention_override is not None  # called only when an override is given
            new = self._override(weights, attention_override.masked_fill(~mask, 0.0).to(weights.dtype), mask)
            captured["weights"] = new
            return new

        def on_attention(module: nn.Module, args: Any, output: Any) -> Any:
            calls.append(1)
            weights = self._weights(output)
            if attention_override is None:
                captured["weights"] = weights
                return None
            return self._replace(output, overridden(weights))

        def on_multihead(weights: Tensor) -> Any:
            calls.append(1)
            if attention_override is None:
                captured["weights"] = weights
                return None
            return overridden(weights), self._rows(weights, mask) > 0

        handles = [self._embedding.register_forward_hook(on_embedding)]
        if self._multihead is None:
            handles.append(self._attention.register_forward_hook(on_attention))
        if self._hidden is not None:
            handles.append(
                self._hidden.register_forward_hook(
                    lambda module, args, output: captured.update(
                        hidden=output[0] if isinstance(output, (tuple, list)) else output
                    )
                )
            )
        try:
            if self._multihead is None:
                logits = self.logits_fn(self.forward_fn(self.module, batch))
            else:
                with MultiheadHooks(self._multihead, on_multihead), slow_attention():
                    logits = self.logits_fn(self.forward_fn(self.module, batch))
        finally:
            for handle in handles:
                handle.remove()
        if not calls:
            raise ProtocolError(
                f"HookAdapter: the attention module {self.attention_name!r} did not run during the "
                "forward pass; name the module that produces the attention weights."
            )
        if len(calls) > 1:
            raise ProtocolError(
                f"HookAdapter: the attention module {self.attention_name!r} ran {len(calls)} times "
                "in one forward pass; name one specific module (e.g. the last layer's)."
            )
        weights = captured["weights"]
        raw, extras = None, {}
        if weights.dim() == 4:
            raw = (weights,)
            rows = self._rows(weights, mask)
            read = weights.masked_fill(~(rows > 0)[:, None, :, None], 0.0)  # rows not read: 0, even a NaN row
            token = torch.einsum("bq,bhqk->bk", rows, read) / weights.shape[1]
            if self.pooling == "mean":
                extras["query_mask"] = mask
        elif weights.dim() == 2:
            token = weights
        else:
            raise ProtocolError(
                f"HookAdapter: attention weights of shape {tuple(weights.shape)}; expected [B, T] or [B, heads, T, T]."
            )
        if token.shape != mask.shape:
            raise ProtocolError(
                f"HookAdapter: attention weights give {tuple(token.shape)} token scores but the token "
                f"mask is {tuple(mask.shape)}."
            )
        if attention_override is None:
            token = token.masked_fill(~mask, 0.0)
            token = token / token.sum(-1, keepdim=True).clamp_min(torch.finfo(token.dtype).tiny)
        else:
            token = attention_override.masked_fill(~mask, 0.0).to(token.dtype)
        return ExplainOutput(
            logits=logits, attention=token, hidden_states=captured.get("hidden"), raw_attentions=raw, extras=extras
        )

    def probe(self, batch: Batch) -> None:
        """Check on one batch what the audits rely on: the attention module runs once and returns weights, and
        those weights feed the logits (an override reaches the output, attention gradients exist).

        Raises:
            ProtocolError: naming the cause (e.g. a module whose output the network does not consume, or
                self-attention without ``pooling=`` / ``query_index=``).
        """
        mask = self.token_mask(batch)
        with torch.enable_grad():
            embeddings = self.embed(batch).detach()
            override = (mask.float() / mask.sum(-1, keepdim=True).clamp_min(1)).requires_grad_()
            logits = self.forward_from_embeddings(embeddings, batch, attention_override=override).logits
            used = logits.requires_grad and torch.autograd.grad(logits.sum(), override, allow_unused=True)[0]
        if used is None or used is False:
            raise ProtocolError(
                f"HookAdapter: the output of the attention module {self.attention_name!r} "
                f"({type(self._attention).__name__}) does not feed the logits, so attention overrides and attention "
                "gradients would silently change nothing. Name the module whose output the rest of the network "
                "consumes (e.g. a softmax module of its own)."
            )

    def forward(self, batch: Batch, attention_override: Optional[Tensor] = None) -> ExplainOutput:
        return self.forward_from_embeddings(self.embed(batch), batch, attention_override=attention_override)

"""Where a ``transformers`` sequence classifier reads: the pooled position(s) of every row, found per model.

Three poolings (:data:`~lightning_xai.adapters.huggingface.families.POOLINGS`):

* ``"first"`` — the BERT family (BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA, ALBERT, DeBERTa, ModernBERT with
  ``classifier_pooling="cls"``, …): the head reads position 0 (``[CLS]``/``<s>``).
* ``"last"`` — decoder ``*ForSequenceClassification`` (GPT-2, Llama, Qwen2/3, Mistral, Gemma, Phi-3, …): the head
  reads the **rightmost position whose id is not** ``pad_token_id``, exactly as transformers computes it from
  ``input_ids`` (so left and right padding both work); without a pad id, position −1. Given only
  ``inputs_embeds`` transformers cannot find it, so the adapter runs the decoder body and applies ``model.score``
  at that position itself (any callable head: a ``peft`` ``ModulesToSaveWrapper`` around ``score`` included).
* ``"mean"`` — ModernBERT with ``classifier_pooling="mean"``: the head averages the last hidden states over
  ``attention_mask``; the reported attention is the mean of those query rows.

:func:`detect_pooling` asks the family table (:mod:`~lightning_xai.adapters.huggingface.families`) first; a family
the table does not list is **probed** (:func:`probe_pooling`): one small batch runs through the model with the
output of its last layer replaced by a leaf tensor, and the gradient of the logits says which positions' hidden
states reach the head. An explicit ``query_index`` replaces the detected position (same for every row). A head
neither the table nor the probe explains raises :class:`~lightning_xai.adapters.protocol.ProtocolError` naming
``query_index=``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Optional, Set, Tuple, cast

import torch
from torch import Tensor, nn

from lightning_xai.adapters.checks import evaluating
from lightning_xai.adapters.huggingface.families import table_pooling
from lightning_xai.adapters.protocol import ProtocolError
from lightning_xai.adapters.sharding import is_sharded

__all__ = ["detect_pooling", "head_reads", "is_causal", "last_non_pad", "pooled_logits", "probe_pooling", "query_mask"]


def detect_pooling(model: nn.Module) -> str:
    """``"first"``, ``"last"`` or ``"mean"``: where ``model``'s classification head reads.

    The family table's answer when ``config.model_type`` is listed there and the class runs transformers' own
    ``forward``, else :func:`probe_pooling`'s. A
    ``"last"`` head must be a callable ``model.score`` (applied per position, then read at the pooled one).

    Raises:
        ProtocolError: a head neither the table nor the probe explains, or a ``"last"`` head without ``score``.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> detect_pooling(BertForSequenceClassification(BertConfig(hidden_size=8, num_hidden_layers=1,
        ...                num_attention_heads=2, intermediate_size=8, vocab_size=10)))
        'first'
    """
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    try:  # the table describes transformers' own classes: a subclass with its own forward is probed
        pooling = table_pooling(config) if _own_forward(model) else None
    except ValueError as error:
        raise ProtocolError(str(error)) from error
    if pooling is None:
        pooling = probe_pooling(model)
    if pooling == "last" and not callable(getattr(model, "score", None)):
        pooling = None
    if pooling is None:
        raise ProtocolError(
            f"HuggingFaceAdapter does not know where {type(model).__name__} (model_type={family!r}) pools its "
            "sequence representation: the family table does not list it and its head reads neither position 0, "
            "each row's last non-pad token through model.score, nor the mean over attention_mask, so the adapter "
            "cannot say which attention row the classifier reads. Pass query_index=<position> (0 for a "
            "[CLS]-style head, -1 for a left-padded last-token head)."
        )
    return pooling


def _own_forward(model: nn.Module) -> bool:
    """Whether ``model`` runs the ``forward`` of a class defined by ``transformers`` (not a user's override)."""
    forward = getattr(type(model), "forward", None)
    return str(getattr(forward, "__module__", "")).startswith("transformers.")


def _probe_points(model: nn.Module) -> List[nn.Module]:
    """Where the probe replaces hidden states: the base model's output (after any final norm), then the last
    module of the layer stack (an ``nn.ModuleList`` of ``config.num_hidden_layers``; for heads such as BERT's
    pooler, which sits inside the base model)."""
    points = []
    base = getattr(model, getattr(model, "base_model_prefix", "") or "", None)
    if isinstance(base, nn.Module) and base is not model:
        points.append(base)
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if isinstance(count, int) and count >= 1:
        stacks = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == count]
        points.extend(stacks[:1][0][-1:] if stacks else [])
    return points


def _with_first(output: Any, leaf: Tensor) -> Any:
    """``output`` with its first tensor (the hidden states) replaced by ``leaf``."""
    if isinstance(output, Tensor):
        return leaf
    if isinstance(output, dict):  # a transformers ModelOutput: its first field
        output[next(iter(output.keys()))] = leaf
        return output
    return type(output)((leaf, *output[1:]))


def _first_tensor(output: Any) -> Optional[Tensor]:
    if isinstance(output, dict):
        output = next(iter(output.values()), None)
    elif isinstance(output, (tuple, list)):
        output = output[0] if output else None
    return output if isinstance(output, Tensor) else None


def _probe_batch(model: Any, device: Any) -> Tuple[Tensor, Tensor, Optional[int]]:
    """Two rows of six ids (the second right-padded by two) when the config names a pad id, else one row.

    ``model``: a ``transformers`` model (its ``config`` and ``get_input_embeddings``, which ``nn.Module`` lacks)."""
    config = model.config
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    pad = getattr(text, "pad_token_id", None)
    pad = pad if isinstance(pad, int) and not isinstance(pad, bool) else None
    special: Set[int] = set()
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"):
        value = getattr(text, name, None)
        special.update(v for v in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(v, int))
    vocab = model.get_input_embeddings().num_embeddings
    ids = [i for i in range(vocab // 2, vocab) if i not in special][:6]
    if len(ids) < 6:
        ids = [i for i in range(vocab) if i not in special][:6]
    row = torch.tensor(ids, device=device)
    if pad is None:
        return row[None], torch.ones(1, 6, dtype=torch.long, device=device), None
    padded = row.clone()
    padded[4:] = pad
    input_ids = torch.stack([row, padded])
    return input_ids, (input_ids != pad).long(), pad


def head_reads(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Optional[Tensor]:
    """``[B, T, C, H]``: the gradient of each logit (at most 8 classes) w.r.t. each position's hidden state.

    The model runs (eval mode, restored after) with the hidden states replaced by a leaf tensor at the first
    point of :func:`_probe_points` whose leaf reaches the logits; a position whose gradient is 0 for every class
    does not reach the head. ``None`` when no point does, or the module there runs more than once.
    """
    for point in _probe_points(model):
        leaves: List[Optional[Tensor]] = []

        def replace(module: nn.Module, args: Any, output: Any, leaves: List[Optional[Tensor]] = leaves) -> Any:
            first = _first_tensor(output)
            if first is None or leaves:
                leaves.append(None)
                return output
            leaf = first.detach().requires_grad_(True)
            leaves.append(leaf)
            return _with_first(output, leaf)

        handle = point.register_forward_hook(replace)
        try:
            with evaluating(model), torch.enable_grad():
                logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
                if len(leaves) != 1 or leaves[0] is None or not logits.requires_grad:
                    continue
                grads = [
                    torch.autograd.grad(logits[:, c].sum(), leaves[0], retain_graph=True, allow_unused=True)[0]
                    for c in range(min(logits.shape[-1], 8))
                ]
        finally:
            handle.remove()
        if all(g is not None for g in grads) and any(bool(g.abs().sum() > 0) for g in grads):
            return torch.stack(grads, 2)
    return None


def probe_pooling(model: nn.Module) -> Optional[str]:
    """Where ``model``'s head reads, from its behaviour on one probe batch (``None`` when no pooling fits).

    Runs :func:`head_reads` on two rows of six ids, the second right-padded by two (one unpadded row when the
    config names no pad id) and matches the positions that reach the logits: position 0 only (``"first"``), each
    row's last non-pad token only (``"last"``), or every non-pad position with the same gradient
    (``"mean"``).

    Example:
        >>> from transformers import GPT2Config, GPT2ForSequenceClassification
        >>> probe_pooling(GPT2ForSequenceClassification(GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=20,
        ...                                                        pad_token_id=0)))
        'last'
    """
    try:
        device = next(model.parameters()).device
        input_ids, attention_mask, pad = _probe_batch(model, device)
        grads = head_reads(model, input_ids, attention_mask)
    except Exception:  # noqa: BLE001 - a model the probe cannot run is a model it cannot explain
        return None
    if grads is None:
        return None
    strength = grads.abs().flatten(2).sum(-1).double()  # [B, T]
    reads = strength > 1e-6 * float(strength.max()) if float(strength.max()) > 0 else None
    if reads is None:
        return None
    T = reads.shape[1]
    if torch.equal(reads, torch.nn.functional.one_hot(torch.zeros_like(input_ids[:, 0]), T).bool()):
        return "first"
    if torch.equal(reads, torch.nn.functional.one_hot(last_non_pad(input_ids, pad), T).bool()):
        return "last"
    if torch.equal(reads, attention_mask.bool()):
        rows = [grads[b][reads[b]].double() for b in range(reads.shape[0])]
        if all(torch.allclose(r, r[:1].expand_as(r), rtol=1e-4, atol=0) for r in rows):
            return "mean"
    return None


def is_causal(model: nn.Module, pooling: str) -> bool:
    """Whether query ``i`` sees only keys ``j <= i`` (decoders, and encoders configured as decoders)."""
    return pooling == "last" or bool(getattr(getattr(model, "config", None), "is_decoder", False))


def last_non_pad(input_ids: Tensor, pad_token_id: Optional[int]) -> Tensor:
    """``LongTensor[B]``: the rightmost position whose id is not ``pad_token_id`` (transformers' own rule).

    Example:
        >>> last_non_pad(torch.tensor([[5, 6, 0, 0], [0, 0, 7, 8]]), 0).tolist()
        [1, 3]
    """
    B, T = input_ids.shape
    if pad_token_id is None:
        return torch.full((B,), T - 1, dtype=torch.long, device=input_ids.device)
    keep = (input_ids != pad_token_id).long()
    return (torch.arange(T, device=input_ids.device) * keep).argmax(-1)


def query_mask(
    pooling: str, batch: Any, attention_mask: Tensor, pad_token_id: Optional[int], query_index: Optional[int]
) -> Tensor:
    """``[B, T]`` bool: the query position(s) each row's classifier reads (exactly one per row unless mean).

    Example:
        >>> query_mask("first", {}, torch.ones(1, 3, dtype=torch.bool), None, None).tolist()
        [[True, False, False]]
    """
    B, T = attention_mask.shape
    if query_index is not None:
        if not -T <= query_index < T:
            raise ValueError(f"query_index={query_index} is outside the batch's {T} positions.")
        positions = torch.full((B,), query_index % T, dtype=torch.long, device=attention_mask.device)
    elif pooling == "mean":
        return attention_mask.bool()
    elif pooling == "last":
        if "input_ids" not in batch:
            raise KeyError("a last-token classifier needs batch['input_ids'] to find each row's last non-pad token.")
        positions = last_non_pad(batch["input_ids"], pad_token_id)
    else:
        positions = torch.zeros(B, dtype=torch.long, device=attention_mask.device)
    return torch.nn.functional.one_hot(positions, T).bool()


def pooled_logits(
    model: nn.Module, kwargs: dict, positions: Tensor, sharded: Optional[bool] = None
) -> Tuple[Tensor, Any]:
    """Run a last-token classifier's body from ``inputs_embeds`` and apply ``model.score`` at ``positions``.

    Returns ``(logits [B, C], body output)``; identical to the model's own logits from ``input_ids``. A model
    sharded with FSDP2 (:func:`~lightning_xai.adapters.sharding.is_sharded`) runs its own forward instead, whose
    layers gather their parameters only inside it, the head's every-position logits read by a forward hook; its
    output carries the same attention maps and hidden states. ``sharded``: whether the model is, if the caller
    already knows (a scorer that runs many passes of one batch asks once); ``None``: asked here.
    """
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if not isinstance(base, nn.Module):
        raise ProtocolError(
            f"{type(model).__name__} has no base model at .{model.base_model_prefix}; pass "
            "query_index= and check its logits with HuggingFaceAdapter.check_logits."
        )
    body = {
        k: v
        for k, v in kwargs.items()
        if k != "token_type_ids" or "token_type_ids" in inspect.signature(base.forward).parameters
    }
    head = cast(Callable[[Tensor], Tensor], model.score)  # detect_pooling checked that a "last" head has one
    if is_sharded(model) if sharded is None else sharded:
        seen: List[Tensor] = []
        handle = cast(nn.Module, head).register_forward_hook(lambda module, args, out: seen.append(out))
        try:
            output = model(**body)
        finally:
            handle.remove()
        logits = seen[-1]
    else:
        output = base(**body)
        logits = head(output.last_hidden_state)  # every position, then the pooled one: the head's own order
    logits = logits[torch.arange(logits.shape[0], device=logits.device), positions.to(logits.device)]
    return logits, output

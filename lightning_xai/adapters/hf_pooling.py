"""Where a ``transformers`` sequence classifier reads: the pooled position(s) of every row, found per model.

Three poolings, detected from the model with no hint from the user:

* ``"first"`` — the BERT family (BERT, RoBERTa, XLM-R, DistilBERT, ELECTRA, ALBERT, DeBERTa, ModernBERT with
  ``classifier_pooling="cls"``, …): the head reads position 0 (``[CLS]``/``<s>``).
* ``"last"`` — decoder ``*ForSequenceClassification`` (GPT-2, Llama, Qwen2/3, Mistral, Gemma, Phi-3, …): the head
  reads the **rightmost position whose id is not** ``pad_token_id``, exactly as transformers computes it from
  ``input_ids`` (so left and right padding both work); without a pad id, position −1. Given only
  ``inputs_embeds`` transformers cannot find it, so the adapter runs the decoder body and applies ``model.score``
  at that position itself.
* ``"mean"`` — ModernBERT with ``classifier_pooling="mean"``: the head averages the last hidden states over
  ``attention_mask``; the reported attention is the mean of those query rows.

An explicit ``query_index`` replaces the detected position (same for every row). A family none of these rules
knows raises :class:`~lightning_xai.adapters.protocol.ProtocolError` naming ``query_index=``.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Optional, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = ["FIRST_TOKEN_FAMILIES", "detect_pooling", "is_causal", "last_non_pad", "pooled_logits", "query_mask"]

#: ``config.model_type`` of encoders whose sequence classifier reads position 0.
FIRST_TOKEN_FAMILIES = frozenset({
    "bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "distilbert", "electra", "albert", "deberta",
    "deberta-v2", "mpnet", "ernie", "nezha", "roc_bert", "megatron-bert", "data2vec-text", "xmod", "luke",
    "big_bird", "rembert", "mobilebert", "squeezebert", "funnel", "layoutlm", "canine", "roformer", "esm", "mra",
    "nystromformer", "yoso", "ibert", "convbert", "markuplm", "bros", "lilt", "flaubert", "xlm"})


@functools.lru_cache(maxsize=None)
def _reads_last_non_pad(cls: type) -> bool:
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "last_non_pad_token" in source or "sequence_lengths" in source


def detect_pooling(model: nn.Module) -> str:
    """``"first"``, ``"last"`` or ``"mean"``: where ``model``'s classification head reads.

    Raises:
        ProtocolError: a family none of the rules in the module docstring knows.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> detect_pooling(BertForSequenceClassification(BertConfig(hidden_size=8, num_hidden_layers=1,
        ...                num_attention_heads=2, intermediate_size=8, vocab_size=10)))
        'first'
    """
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family == "modernbert":
        pooling = getattr(config, "classifier_pooling", "cls")
        if pooling not in ("cls", "mean"):
            raise ProtocolError(f"ModernBERT classifier_pooling={pooling!r} is not understood; use 'cls' or 'mean'.")
        return "first" if pooling == "cls" else "mean"
    if isinstance(getattr(model, "score", None), nn.Linear) and _reads_last_non_pad(type(model)):
        return "last"
    if family in FIRST_TOKEN_FAMILIES:
        return "first"
    raise ProtocolError(
        f"HuggingFaceAdapter does not know where {type(model).__name__} (model_type={family!r}) pools its "
        "sequence representation, so it cannot say which attention row the classifier reads. Pass "
        "query_index=<position> (0 for a [CLS]-style head, -1 for a left-padded last-token head).")


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


def query_mask(pooling: str, batch: Any, attention_mask: Tensor, pad_token_id: Optional[int],
               query_index: Optional[int]) -> Tensor:
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


def pooled_logits(model: nn.Module, kwargs: dict, positions: Tensor) -> Tuple[Tensor, Any]:
    """Run a last-token classifier's body from ``inputs_embeds`` and apply ``model.score`` at ``positions``.

    Returns ``(logits [B, C], body output)``; identical to the model's own logits from ``input_ids``.
    """
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if not isinstance(base, nn.Module):
        raise ProtocolError(f"{type(model).__name__} has no base model at .{model.base_model_prefix}; pass "
                            "query_index= and check its logits with HuggingFaceAdapter.check_logits.")
    body = {k: v for k, v in kwargs.items() if k != "token_type_ids" or "token_type_ids" in
            inspect.signature(base.forward).parameters}
    output = base(**body)
    hidden = output.last_hidden_state
    logits = model.score(hidden)  # every position, then the pooled one: the head's own order of operations
    logits = logits[torch.arange(hidden.shape[0], device=hidden.device), positions.to(hidden.device)]
    return logits, output

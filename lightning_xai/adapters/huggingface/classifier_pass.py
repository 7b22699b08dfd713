"""One explained pass of a ``transformers`` classifier from word embeddings, and what the protocol reads of it.

:class:`~lightning_xai.adapters.HuggingFaceAdapter` holds the model and its options; a pass of it (:func:`run_pass`)
knows the keyword arguments the model is called with (``inputs_embeds=``, the attention mask, token types, maps or
logits only), the ``attention_override`` installed for this pass only (:func:`override_state`: refused on a model
that cannot take one, else the rows of :func:`~lightning_xai.adapters.huggingface.attention.override_rows` on the
last attention module, through the hook of a family with native attention,
:mod:`~lightning_xai.adapters.huggingface.native`), the contexts every pass runs in (recording attention, gradient
checkpointing off, FSDP routing through the root) and where the logits are read (the query row of a last-token
head). :func:`explained_output` reads the :class:`ExplainOutput` of a pass: the raw maps reduced by the adapter's
reduction and renormalised over real tokens, the pooled rows and query positions (see the adapter's module
docstring).

``adapter`` is a :class:`~lightning_xai.adapters.HuggingFaceAdapter` (its model, options and input methods are read,
as :mod:`.replay` and :mod:`.packing` read them).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Optional, Tuple

from torch import Tensor

from lightning_xai.adapters.huggingface.attention import (
    OverrideState,
    active_override,
    override_rows,
    recording_attention,
)
from lightning_xai.adapters.huggingface.inputs import check_sight
from lightning_xai.adapters.huggingface.native import native_override
from lightning_xai.adapters.huggingface.pooling import pooled_logits
from lightning_xai.adapters.huggingface.reductions import pooled_rows, token_distribution
from lightning_xai.adapters.huggingface.unwrap import unchecked_layers
from lightning_xai.adapters.protocol import Batch, ExplainOutput, ProtocolError, check_embeddings
from lightning_xai.adapters.sharding import routed_through_root

__all__ = ["explained_output", "override_state", "run_pass"]


def override_state(
    adapter: Any, attention_override: Tensor, attention_mask: Tensor, mask: Tensor, qmask: Tensor
) -> OverrideState:
    """The override a pass of ``adapter`` runs under: ``attention_override``'s rows (``override_specials`` says what
    a ``[B, T]`` one does with the special tokens' mass) in place of the ``qmask`` rows of the last attention module.

    Raises:
        ProtocolError: the model computes attention in its own modeling file, or declares no attention modules.
    """
    if not adapter.overridable:
        raise ProtocolError(
            f"{type(adapter.model).__name__} computes attention inside its own modeling file "
            "(no transformers AttentionInterface), so attention_override is not supported: "
            "audits that replace attention (ErasureAudit, AttentionBaselines) cannot run on "
            "it; attention maps and every saliency method do."
        )
    if not adapter._attention_modules:
        raise ProtocolError(
            f"{type(adapter.model).__name__} does not declare its attention modules "
            "(_can_record_outputs['attentions']), so attention_override cannot find the last "
            "layer; use HookAdapter for this model."
        )
    rows = override_rows(attention_override, attention_mask.bool(), mask, adapter.override_specials)
    return OverrideState(adapter._attention_modules[-1], qmask, rows, calls=adapter._last_module_calls())


def run_pass(
    adapter: Any, embeddings: Tensor, batch: Batch, attention_override: Optional[Tensor], *, maps: bool = True
) -> Tuple[Tensor, Any, Tensor, Tensor]:
    """``(logits, the model's output, token mask, query mask)`` of one pass of ``adapter``'s model from
    ``embeddings``, under ``attention_override`` when given; ``maps=False`` asks the model for no attention maps and
    hidden states (the logits-only passes of :mod:`~lightning_xai.adapters.huggingface.replay`).

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                     intermediate_size=16, max_position_embeddings=16)
        >>> adapter = HuggingFaceAdapter(BertForSequenceClassification(config).eval())
        >>> batch = {"input_ids": torch.tensor([[2, 7, 8, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
        ...          "mask": torch.tensor([[False, True, True, False]])}
        >>> logits, output, mask, qmask = run_pass(adapter, adapter.embed(batch), batch, None, maps=False)
        >>> logits.shape, output.attentions, qmask.long().argmax(-1).tolist()
        (torch.Size([1, 2]), None, [0])
    """
    mask = adapter.token_mask(batch)
    check_embeddings(embeddings, mask)
    attention_mask = adapter._attention_mask(batch)
    qmask = adapter.query_mask(batch)
    if adapter.causal:
        check_sight(qmask, mask, adapter.query_index)
    kwargs = {
        "inputs_embeds": embeddings,
        "attention_mask": attention_mask,
        "output_attentions": maps,
        "output_hidden_states": maps,
        "return_dict": True,
    }
    if "token_type_ids" in batch:
        kwargs["token_type_ids"] = batch["token_type_ids"]
    token = None
    if attention_override is not None:
        token = active_override().set(override_state(adapter, attention_override, attention_mask, mask, qmask))
    model = adapter.model
    hook = (
        native_override(adapter._attention_modules[-1])
        if token is not None and getattr(adapter, "_native", False)
        else nullcontext()
    )
    try:  # un-checkpointed: a checkpointed layer would recompute in backward outside these contexts
        with (
            recording_attention(model),
            unchecked_layers(model),
            hook,
            routed_through_root(model, adapter._embedding, kwargs, batch.get("input_ids")),
        ):
            if adapter._head_pooling == "last":  # the head reads the query row: query_index= moves it too
                logits, output = pooled_logits(model, kwargs, qmask.long().argmax(-1))
            else:
                output = model(**kwargs)
                logits = output.logits
    finally:
        if token is not None:
            active_override().reset(token)
    return logits, output, mask, qmask


def explained_output(
    adapter: Any, embeddings: Tensor, batch: Batch, attention_override: Optional[Tensor]
) -> ExplainOutput:
    """The :class:`ExplainOutput` of one pass of ``adapter`` (its ``_run``): the logits, the adapter's attention
    reduction of the raw maps renormalised over real tokens, the last hidden states, the raw maps, and ``extras``
    (``cls_rows``, ``query_mask``, ``all_hidden_states``, ``query_positions`` when each row reads one position).

    Raises:
        ProtocolError: the model returned no attention maps (not loaded with eager attention).
        ValueError: the reduction's shape is not the token mask's.
    """
    logits, output, mask, qmask = adapter._run(embeddings, batch, attention_override)
    raw = tuple(output.attentions) if getattr(output, "attentions", None) is not None else ()
    if not raw:
        raise ProtocolError(
            f"{type(adapter.model).__name__} returned no attention maps (attn_implementation="
            f"{getattr(adapter.model.config, '_attn_implementation', None)!r}); load it with "
            "attn_implementation='eager'."
        )
    attention = token_distribution(adapter._reduce(raw, batch, qmask), mask)
    hidden = output.hidden_states[-1] if getattr(output, "hidden_states", None) else None
    extras = {
        "cls_rows": pooled_rows(raw[-1], qmask),
        "query_mask": qmask,
        "all_hidden_states": getattr(output, "hidden_states", None),
    }
    if bool((qmask.sum(-1) == 1).all()):
        extras["query_positions"] = qmask.long().argmax(-1)
    return ExplainOutput(logits=logits, attention=attention, hidden_states=hidden, raw_attentions=raw, extras=extras)

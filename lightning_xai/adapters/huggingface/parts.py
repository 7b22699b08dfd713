"""Where a ``transformers`` model keeps the parts an adapter reads: its input word embedding and the attention modules
whose outputs it records."""

from __future__ import annotations

from typing import List

from torch import nn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = ["input_embedding", "recorded_attention_modules"]


def input_embedding(model: nn.Module) -> nn.Embedding:
    """The model's input word embedding (``get_input_embeddings()``), or a :class:`ProtocolError` naming the fix."""
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
            "attention='<name>')."
        )
    return embedding


def recorded_attention_modules(model: nn.Module) -> List[nn.Module]:
    """The modules whose outputs ``transformers`` records as ``attentions`` (``_can_record_outputs``); [] if none."""
    recorders = getattr(model, "_can_record_outputs", None) or {}
    target = recorders.get("attentions") if isinstance(recorders, dict) else None
    target = getattr(target, "target_class", target)
    if isinstance(target, type):
        modules = [m for m in model.modules() if isinstance(m, target)]
        if modules:
            return modules
    return []

"""Where a ``transformers`` model keeps the parts an adapter reads: its input word embedding and the attention modules
whose outputs it records, and an encoder–decoder's last cross-attention (what a generator's override replaces)."""

from __future__ import annotations

from typing import List, Optional

from torch import nn

from lightning_xai.adapters.protocol import ProtocolError

__all__ = ["input_embedding", "last_cross_attention", "randomization_stages", "recorded_attention_modules"]


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


def _layer_list(base: nn.Module, attention_modules: List[nn.Module]) -> Optional[nn.ModuleList]:
    """The ``nn.ModuleList`` of ``base`` whose every element holds attention modules and which holds them all."""
    wanted = {id(m) for m in attention_modules}
    for candidate in base.modules():
        if not isinstance(candidate, nn.ModuleList) or not len(candidate):
            continue
        held = [{id(m) for m in layer.modules()} & wanted for layer in candidate]
        if all(held) and set().union(*held) == wanted:
            return candidate
    return None


def randomization_stages(
    model: nn.Module, embedding: nn.Embedding, attention_modules: List[nn.Module]
) -> List[nn.Module]:
    """Adebayo et al.'s cascade for a ``transformers`` classifier, from the output to the input: the head (the
    model's children with parameters other than its base model), what else the base model holds beside its layers
    and embeddings (a pooler, a final norm), each layer of its stack from the top, and its embedding module.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> model = BertForSequenceClassification(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2,
        ...                                                  num_attention_heads=2, intermediate_size=8))
        >>> attention = recorded_attention_modules(model)
        >>> stages = randomization_stages(model, model.get_input_embeddings(), attention)
        >>> names = {m: n for n, m in model.named_modules()}
        >>> [names[m] for m in stages]
        ['classifier', 'bert.pooler', 'bert.encoder.layer.1', 'bert.encoder.layer.0', 'bert.embeddings']
    """
    base = getattr(model, "base_model", None)
    base = base if isinstance(base, nn.Module) and base is not model else None

    def parameterised(module: nn.Module) -> bool:
        return any(True for _ in module.parameters())

    head = [m for m in model.children() if m is not base and parameterised(m)]
    root = base if base is not None else model
    layers = _layer_list(root, attention_modules)
    owner = next((m for m in root.modules() if any(c is embedding for c in m.children())), None)
    embeddings: nn.Module = owner if owner is not None and owner is not root else embedding
    inner = set(layers.modules()) if layers is not None else set()
    inner |= set(embeddings.modules())
    beside = [
        m
        for m in (root.children() if base is not None else ())
        if m not in inner and parameterised(m) and not (set(m.modules()) & inner)
    ]
    stack = list(reversed(list(layers))) if layers is not None else []
    return head + beside + stack + [embeddings]


def last_cross_attention(model: nn.Module) -> Optional[nn.Module]:
    """The module whose call computes the last decoder layer's cross-attention weights (``None``: not found)."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder: Optional[nn.Module] = get_decoder() if callable(get_decoder) else None
    recorders = getattr(decoder, "_can_record_outputs", None) or {}
    recorder = recorders.get("cross_attentions") if isinstance(recorders, dict) else None
    target = getattr(recorder, "target_class", recorder)
    name = getattr(recorder, "layer_name", None)
    if decoder is None or not (isinstance(target, type) and issubclass(target, nn.Module)):
        return None  # (only an nn.Module class has instances among the decoder's modules)
    found = [m for path, m in decoder.named_modules() if isinstance(m, target) and (not name or path.endswith(name))]
    module = found[-1] if found else None
    while module is not None:  # a wrapper layer (T5's T5LayerCrossAttention) holds the attention module itself
        inner = [c for c in module.children() if type(c).__name__.endswith("Attention")]
        if len(inner) != 1:
            break
        module = inner[0]
    return module

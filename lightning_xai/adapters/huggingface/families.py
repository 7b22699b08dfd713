"""What lightning_xai knows about ``transformers`` model families: one table, keyed by ``config.model_type``.

Every family fact the Hugging Face code uses lives here and nowhere else:

* **pooling** — where the sequence classifier reads: ``"first"`` (position 0, ``[CLS]``/``<s>``), ``"last"`` (each
  row's last non-pad token, transformers' decoder rule) or ``"mean"`` (the mean over ``attention_mask``); a family
  whose config chooses (ModernBERT's ``classifier_pooling``) names the config field and what its values mean. A
  family without an entry, or with ``pooling=None``, is probed: :func:`~lightning_xai.adapters.huggingface.pooling.
  probe_pooling` watches which position's hidden state moves the logits.
* **native attention** — the modeling file computes attention itself instead of dispatching through transformers'
  ``AttentionInterface`` (DeBERTa): maps come from ``output_attentions``; overrides go through a hook on the attention
  dropout where :mod:`~lightning_xai.adapters.huggingface.native` recognises the module (DeBERTa-v2/v3), and are
  refused otherwise (DeBERTa v1).
* **shared layers** — one set of layer modules runs several times (ALBERT: ``num_hidden_layers`` layers share
  ``num_hidden_groups`` groups): an override must replace the last call of the shared attention module only.
* **layout** — where one transformer block keeps its value projection, output projection and post-residual norm,
  and how the block continues after the output projection (:class:`Layout`; read by the context-mixing methods).
* **embedding scale** — an encoder that multiplies its word embeddings by a factor only when it looks them up itself
  (Marian, Pegasus: ``inputs_embeds`` skip it): the attribute of ``model.get_encoder()`` holding the factor, which the
  generation adapter's ``embed`` applies so that running from embeddings computes the model's own function.
* **AttnLRP rules** — whether the AttnLRP rules of :mod:`lightning_xai.attribution.context_mixing.attnlrp` cover the
  family's attention and MLP (separate q/k/v projections; post-LN encoders, pre-RMSNorm gated-MLP decoders).

Like LXT's ``models/<family>`` modules joined by one map, each family is one :class:`Family` record; unlike them,
the records are plain data (attribute paths, names), so adding a family is one line and no code.

Example:
    >>> from transformers import LlamaConfig, ModernBertConfig
    >>> family_of(LlamaConfig()).pooling, family_of(LlamaConfig()).layout.name
    ('last', 'llama')
    >>> table_pooling(ModernBertConfig(classifier_pooling="mean"))
    'mean'
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from torch import nn

__all__ = [
    "BERT_LAYOUT",
    "DISTILBERT_LAYOUT",
    "FAMILIES",
    "Family",
    "LAYOUTS",
    "LLAMA_LAYOUT",
    "Layout",
    "POOLINGS",
    "family_of",
    "layout_of",
    "module_calls",
    "native_attention",
    "table_pooling",
]

#: the poolings a classifier head may have (see the module docstring)
POOLINGS = ("first", "last", "mean")


@dataclass(frozen=True)
class Layout:
    """Where one transformer block keeps its attention parts: attribute paths relative to the block.

    Attributes:
        name: how the block continues after the attention output projection (the context-mixing ``block_tail``):
            ``"bert"`` (post-LN, ``feed_forward_chunk``), ``"distilbert"`` (post-LN ``ffn``) or ``"llama"``
            (pre-norm, residual ``mlp``).
        value: the value projection (its output includes ``b_V``).
        out: the attention output projection ``W_O`` (its output includes ``b_O``).
        norm_after: the layer norm after the attention residual sum; ``None`` for pre-norm blocks.
        requires: further paths a block of this layout has (to recognise it among a model's modules).
    """

    name: str
    value: str
    out: str
    norm_after: Optional[str]
    requires: Tuple[str, ...] = ()

    def parts(self, block: nn.Module) -> Optional[Tuple[nn.Module, nn.Module, Optional[nn.Module]]]:
        """``(value, out, norm_after)`` modules of ``block``, or ``None`` when ``block`` is not of this layout.

        Example:
            >>> from transformers import BertConfig
            >>> from transformers.models.bert.modeling_bert import BertLayer
            >>> block = BertLayer(BertConfig(hidden_size=8, num_attention_heads=2, intermediate_size=8))
            >>> [type(m).__name__ for m in BERT_LAYOUT.parts(block)], LLAMA_LAYOUT.parts(block)
            (['Linear', 'Linear', 'LayerNorm'], None)
        """
        paths = (self.value, self.out) + ((self.norm_after,) if self.norm_after else ()) + self.requires
        try:
            found = [operator.attrgetter(path)(block) for path in paths]
        except AttributeError:
            return None
        if not all(isinstance(module, nn.Module) for module in found):
            return None
        return found[0], found[1], found[2] if self.norm_after else None


#: BERT-like blocks (``BertLayer`` and its copies): post-LN, ``attention.self.value`` / ``attention.output.dense``
BERT_LAYOUT = Layout("bert", "attention.self.value", "attention.output.dense", "attention.output.LayerNorm")
#: DistilBERT's ``TransformerBlock``: post-LN with ``sa_layer_norm``
DISTILBERT_LAYOUT = Layout("distilbert", "attention.v_lin", "attention.out_lin", "sa_layer_norm")
#: Llama-like decoder layers: pre-norm (``input_layernorm``), no norm after the residual sum
LLAMA_LAYOUT = Layout("llama", "self_attn.v_proj", "self_attn.o_proj", None, requires=("input_layernorm",))
#: every layout, in the order a model of a family without a layout entry is matched against them
LAYOUTS = (BERT_LAYOUT, DISTILBERT_LAYOUT, LLAMA_LAYOUT)


@dataclass(frozen=True)
class Family:
    """Everything known about one ``config.model_type`` (see the module docstring for each fact).

    Attributes:
        pooling: ``"first"``, ``"last"``, ``"mean"``, or ``None`` (probe the model).
        pooling_field: a config field that chooses the pooling; its value is looked up in ``pooling_values``.
        pooling_values: the pooling each value of ``pooling_field`` means.
        native_attention: attention computed by the modeling file itself (no ``AttentionInterface``).
        shared_layers: ``num_hidden_layers`` layers run ``num_hidden_groups`` shared groups of modules.
        layout: the block layout, or ``None`` (matched against :data:`LAYOUTS`).
        attnlrp: AttnLRP's rules cover the family (it has a layout then).
        embedding_scale: the encoder attribute holding a factor it applies to looked-up word embeddings only.
    """

    pooling: Optional[str] = None
    pooling_field: Optional[str] = None
    pooling_values: Mapping[str, str] = field(default_factory=dict)
    native_attention: bool = False
    shared_layers: bool = False
    layout: Optional[Layout] = None
    attnlrp: bool = False
    embedding_scale: Optional[str] = None


_FIRST = Family("first")
_BERT = Family("first", layout=BERT_LAYOUT)
_BERT_LRP = Family("first", layout=BERT_LAYOUT, attnlrp=True)
_DECODER_LRP = Family("last", layout=LLAMA_LAYOUT, attnlrp=True)
_LAST = Family("last")

#: The family table: ``config.model_type`` -> :class:`Family`.
FAMILIES: Dict[str, Family] = {
    # encoders whose classifier reads position 0, with BERT's block layout
    **{name: _BERT_LRP for name in ("bert", "roberta", "xlm-roberta", "camembert", "electra")},
    **{name: _BERT for name in ("ernie", "data2vec-text", "roc_bert", "layoutlm", "markuplm")},
    # encoders whose classifier reads position 0 (blocks of their own layout)
    **{
        name: _FIRST
        for name in (
            "xlm-roberta-xl",
            "mpnet",
            "nezha",
            "megatron-bert",
            "xmod",
            "luke",
            "big_bird",
            "rembert",
            "mobilebert",
            "squeezebert",
            "funnel",
            "canine",
            "roformer",
            "esm",
            "mra",
            "nystromformer",
            "yoso",
            "ibert",
            "convbert",
            "bros",
            "lilt",
            "flaubert",
            "xlm",
        )
    },
    "distilbert": Family("first", layout=DISTILBERT_LAYOUT, attnlrp=True),
    "albert": Family("first", shared_layers=True),
    "deberta": Family("first", native_attention=True),
    "deberta-v2": Family("first", native_attention=True),
    "modernbert": Family(pooling_field="classifier_pooling", pooling_values={"cls": "first", "mean": "mean"}),
    # decoders: the classifier reads each row's last non-pad token
    **{name: _DECODER_LRP for name in ("llama", "qwen2", "mistral", "qwen3", "gemma")},
    **{name: _LAST for name in ("gpt2", "phi3")},
    # encoder–decoders whose encoder scales looked-up word embeddings only (inputs_embeds skip the factor)
    **{
        name: Family(embedding_scale="embed_scale") for name in ("marian", "pegasus", "blenderbot-small", "mvp", "fsmt")
    },
}


def family_of(config: Any) -> Optional[Family]:
    """The table's :class:`Family` of ``config.model_type`` (``None`` for a family the table does not list)."""
    model_type = getattr(config, "model_type", None)
    return FAMILIES.get(model_type) if isinstance(model_type, str) else None


def table_pooling(config: Any) -> Optional[str]:
    """The pooling the table gives for ``config`` (``None``: not in the table; probe the model).

    Raises:
        ValueError: the family's pooling field holds a value the table does not know.

    Example:
        >>> from transformers import BertConfig, GPT2Config
        >>> table_pooling(BertConfig()), table_pooling(GPT2Config())
        ('first', 'last')
    """
    family = family_of(config)
    if family is None:
        return None
    if family.pooling_field is None:
        return family.pooling
    value = getattr(config, family.pooling_field, None)
    if not isinstance(value, str) or value not in family.pooling_values:
        raise ValueError(
            f"{config.model_type} {family.pooling_field}={value!r} is not understood; use one of "
            f"{sorted(family.pooling_values)}."
        )
    return family.pooling_values[value]


def native_attention(config: Any) -> bool:
    """Whether the family computes attention in its own modeling file (no ``AttentionInterface``)."""
    family = family_of(config)
    return bool(family is not None and family.native_attention)


def layout_of(config: Any) -> Optional[Layout]:
    """The family's block :class:`Layout` (``None``: not listed; match the blocks against :data:`LAYOUTS`)."""
    family = family_of(config)
    return None if family is None else family.layout


def module_calls(config: Any, index: int) -> int:
    """How many times one forward pass runs the attention module of layer ``index`` (``-1``: the last).

    1, except for families with shared layers (ALBERT): layer ``i`` runs group ``int(i / (L / G))`` of the
    ``G = num_hidden_groups`` groups, so the module of a group runs once per layer of that group.

    Example:
        >>> from transformers import AlbertConfig, BertConfig
        >>> module_calls(AlbertConfig(num_hidden_layers=6, num_hidden_groups=2), -1), module_calls(BertConfig(), -1)
        (3, 1)
    """
    family = family_of(config)
    if family is None or not family.shared_layers:
        return 1
    layers, groups = int(config.num_hidden_layers), int(getattr(config, "num_hidden_groups", 1) or 1)
    group = lambda i: int(i / (layers / groups))  # noqa: E731 - ALBERT's own assignment of layers to groups
    mine = group(index % layers)
    return sum(group(i) == mine for i in range(layers))

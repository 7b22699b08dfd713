"""``attention_override`` for families that compute attention in their own modeling file (DeBERTa-v2/v3).

DeBERTa-v2's ``DisentangledSelfAttention`` does not dispatch through transformers' ``AttentionInterface``: it takes
``softmax(scores)``, passes it through its attention-dropout module and multiplies the result with the values. The
dropout module's output is therefore exactly the weights that mix the values. :func:`native_override` puts a
forward hook on the last attention module's dropout, **for the duration of one override pass only**, that replaces
the pooled query rows of that output by the override's
(:func:`~lightning_xai.adapters.huggingface.attention.replace_pooled_rows`, the same rows the registered attention
function makes for every other family). In eval mode the dropout is the identity, so the hook sees the softmax itself;
an own-row override gives the logits back bit for bit (``tests/adapters/test_families.py``). Outside an override no
hook is attached: the model trains and runs untouched.

Only modules of the shape above are recognised (:func:`native_attention_modules`): DeBERTa v1's talking-head variant
mixes heads after the dropout and is left refused.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List, cast

from torch import nn

from lightning_xai.adapters.huggingface.attention import replace_pooled_rows

__all__ = ["native_attention_modules", "native_override"]


def native_attention_modules(model: nn.Module) -> List[nn.Module]:
    """The model's DeBERTa-v2-style self-attention modules, in order (``[]``: none this module can override).

    A module counts when it has ``disentangled_attention_bias`` (DeBERTa-v2's relative-position term) and an
    ``nn.Dropout`` named ``dropout`` applied to its probabilities right before ``probs @ values``.

    Example:
        >>> from transformers import DebertaV2Config, DebertaV2ForSequenceClassification, BertConfig, BertModel
        >>> small = dict(vocab_size=20, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=8)
        >>> len(native_attention_modules(DebertaV2ForSequenceClassification(DebertaV2Config(**small))))
        2
        >>> native_attention_modules(BertModel(BertConfig(**small)))
        []
    """
    return [
        m
        for m in model.modules()
        if callable(getattr(m, "disentangled_attention_bias", None))
        and isinstance(getattr(m, "dropout", None), nn.Dropout)
    ]


@contextlib.contextmanager
def native_override(module: nn.Module) -> Iterator[None]:
    """Inside the block, the running override (``active_override()``) replaces the pooled rows of ``module``'s
    attention probabilities after its attention dropout; the hook is removed on exit."""

    def replace(_dropout: nn.Module, _inputs: tuple, weights):  # the forward hook: its return replaces the output
        return replace_pooled_rows(module, weights)

    dropout = cast(nn.Dropout, module.dropout)  # native_attention_modules picks modules with an nn.Dropout there
    handle = dropout.register_forward_hook(replace)
    try:
        yield
    finally:
        handle.remove()

"""Kindermans et al.'s input shift on a ``transformers`` model: every word embedding moves by a constant vector ``c``
and the model computes the same function.

A transformer adds its word embeddings to other embeddings before anything non-linear reads them (BERT, RoBERTa,
DistilBERT, ALBERT, ELECTRA, MPNet, GPT-2: absolute position embeddings, and token-type embeddings in the BERT
family). Subtracting ``c`` from every row of such a table, one that is added at every position, keeps each sum
``(e + c) + (p − c) = e + p`` the same (up to float rounding), so the shifted model's logits are the original's
while its inputs, the word embeddings the attribution methods read, are shifted: the setting of the
input-invariance check (:mod:`lightning_xai.audits.input_invariance`). Models whose first operation reads the word
embeddings alone (Llama, Qwen2, Mistral: rotary positions, a normalisation first) have no such table, and a shift
cannot be compensated inside them: :func:`embedding_shift_refusal` says so before any copy is made.

An output embedding tied to the input table (a language-model head) is untied first, so the head keeps its weights.
The compensation is checked on a probe sequence: a table whose rows are not added at every position (e.g. a
relative-position model's unused table) leaves the logits changed and is refused by name.
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor, nn

__all__ = ["compensating_tables", "embedding_shift_refusal", "shift_input_embeddings"]

#: the largest logit change a compensated shift may cause on the probe, relative to the logits' scale
PROBE_TOLERANCE = 1e-4


def _owner(model: nn.Module, word: nn.Embedding) -> Optional[nn.Module]:
    for module in model.modules():
        if any(child is word for child in module.children()):
            return module
    return None


def compensating_tables(model: nn.Module, word: nn.Embedding) -> List[nn.Embedding]:
    """The embedding tables next to ``word`` (children of the module that holds it) of its width: the candidates
    whose rows are added to the word embeddings, the one with the most rows (absolute positions) first.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> model = BertForSequenceClassification(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
        ...                                                  num_attention_heads=2, intermediate_size=8))
        >>> [t.num_embeddings for t in compensating_tables(model, model.get_input_embeddings())]
        [512, 2]
    """
    owner = _owner(model, word)
    if owner is None:
        return []
    tables = [
        m
        for m in owner.children()
        if isinstance(m, nn.Embedding) and m is not word and m.embedding_dim == word.embedding_dim
    ]
    return sorted(tables, key=lambda t: -t.num_embeddings)


def embedding_shift_refusal(model: nn.Module, word: nn.Embedding) -> Optional[str]:
    """Why a shift of ``model``'s word embeddings cannot be compensated inside it, or ``None`` when a table can.

    Example:
        >>> from transformers import LlamaConfig, LlamaForSequenceClassification
        >>> llama = LlamaForSequenceClassification(LlamaConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
        ...                                                    num_attention_heads=2, intermediate_size=8))
        >>> print(embedding_shift_refusal(llama, llama.get_input_embeddings()))  # doctest: +ELLIPSIS
        LlamaForSequenceClassification adds no position or token-type embedding to its word embeddings ...
    """
    if compensating_tables(model, word):
        return None
    return (
        f"{type(model).__name__} adds no position or token-type embedding to its word embeddings (its first "
        "layer reads them alone), so a constant shift of the inputs cannot be compensated inside the model and "
        "Kindermans et al.'s input-invariance check does not apply to it"
    )


def _probe_logits(model: nn.Module, word: nn.Embedding) -> Tensor:
    count = min(word.num_embeddings, 6)
    ids = torch.arange(word.num_embeddings - count, word.num_embeddings, device=word.weight.device)[None]
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out.logits if hasattr(out, "logits") else out[0]


def _untie_output(model: nn.Module, word: nn.Embedding) -> None:
    getter = getattr(model, "get_output_embeddings", None)
    output = getter() if callable(getter) else None
    if output is not None and getattr(output, "weight", None) is word.weight:
        output.weight = nn.Parameter(word.weight.detach().clone(), requires_grad=word.weight.requires_grad)


def shift_input_embeddings(model: nn.Module, word: nn.Embedding, shift: Tensor) -> None:
    """In place: add ``shift`` (``[E]``) to every row of ``word`` and subtract it from every row of the first table
    that compensates it (checked on a probe sequence); ``model`` then computes the same logits.

    Raises:
        ValueError: no table next to the word embeddings compensates the shift (:func:`embedding_shift_refusal`).

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> model = BertForSequenceClassification(BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1,
        ...                                                  num_attention_heads=2, intermediate_size=8)).eval()
        >>> ids = torch.tensor([[2, 7, 9, 3]])
        >>> before = model(input_ids=ids).logits
        >>> shift_input_embeddings(model, model.get_input_embeddings(), torch.full((8,), 0.5))
        >>> torch.allclose(model(input_ids=ids).logits, before, atol=1e-5)
        True
    """
    refusal = embedding_shift_refusal(model, word)
    if refusal is not None:
        raise ValueError(refusal + ".")
    shift = shift.detach().to(word.weight)
    _untie_output(model, word)
    before = _probe_logits(model, word)
    scale = before.abs().max().clamp_min(1.0)
    with torch.no_grad():
        word.weight.add_(shift)
        for table in compensating_tables(model, word):
            table.weight.sub_(shift)
            if float((_probe_logits(model, word) - before).abs().max()) <= PROBE_TOLERANCE * float(scale):
                return
            table.weight.add_(shift)
        word.weight.sub_(shift)
    raise ValueError(
        f"{type(model).__name__}: no embedding table next to its word embeddings compensates a constant shift (the "
        "logits of a probe sequence changed with each), so Kindermans et al.'s input-invariance check does not "
        "apply to it."
    )

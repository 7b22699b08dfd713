"""Hugging Face ``transformers`` classifiers seen through the :class:`~lightning_xai.adapters.ExplainableModel`
protocol.

One module per concern; :mod:`.families` is the one place that knows facts about model families:

* :mod:`.adapter` — :class:`HuggingFaceAdapter`, the protocol on a sequence classifier; :mod:`.classifier_pass` runs
  one pass of it from embeddings (the override installed, the logits read where the head reads) and reads its output;
* :mod:`.generation` — :class:`HuggingFaceGenerationAdapter`, what :class:`HuggingFaceAdapter` builds for a causal LM
  or an encoder–decoder (the explained output is a target sequence; :mod:`.steps` finds its steps, :mod:`.step_copies`
  cuts one copy of a row per step for the per-step maps);
* :mod:`.families` — the family table: pooling, attention dispatch, shared layers, layer layouts;
* :mod:`.pooling` — where the head reads (the table, else a probe of the model's behaviour);
* :mod:`.attention` — the registered eager attention with a replaceable query row;
* :mod:`.reductions` — raw maps to one ``[B, T]`` distribution;
* :mod:`.tokens` — which positions are real tokens;
* :mod:`.replay` and :mod:`.packing` — many overrides scored running only the last layer and the head.
"""

from lightning_xai.adapters.huggingface.adapter import (
    ATTENTION_IMPLEMENTATION,
    HuggingFaceAdapter,
    attention_rollout,
    register_attention_implementation,
)
from lightning_xai.adapters.huggingface.generation import HuggingFaceGenerationAdapter, is_generator
from lightning_xai.adapters.huggingface.reductions import Reduction

__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "HuggingFaceAdapter",
    "HuggingFaceGenerationAdapter",
    "Reduction",
    "attention_rollout",
    "is_generator",
    "register_attention_implementation",
]

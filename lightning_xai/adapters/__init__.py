"""How a model is seen: the :class:`ExplainableModel` protocol and the adapters that implement it."""

from lightning_xai.adapters.checks import check_attention_distribution, check_token_ids, vocabulary_size
from lightning_xai.adapters.hooks import HookAdapter
from lightning_xai.adapters.huggingface import HuggingFaceAdapter, attention_rollout
from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput, ProtocolError, as_explainable
from lightning_xai.adapters.resolve import explainable_model
from lightning_xai.adapters.word_level import pieces_to_words, to_word_level, words_to_pieces

__all__ = [
    "Batch",
    "ExplainOutput",
    "ExplainableModel",
    "HookAdapter",
    "HuggingFaceAdapter",
    "ProtocolError",
    "as_explainable",
    "attention_rollout",
    "check_attention_distribution",
    "check_token_ids",
    "explainable_model",
    "pieces_to_words",
    "to_word_level",
    "vocabulary_size",
    "words_to_pieces",
]

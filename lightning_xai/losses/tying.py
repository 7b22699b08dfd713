"""Tutek & Šnajder (2020): word-level objectives that tie each hidden state to its input word.

Attention weighs hidden states, not words; when a BiLSTM mixes the sentence into every h_t, "attention on
position t" no longer means "attention on word t". Tutek & Šnajder ("Staying True to Your Word: (How) Can
Attention Become Explanation?", RepL4NLP 2020) add a word-level objective that keeps h_t about its own word, so
attention over hidden states reads the words. Two forms are implemented (``mode``):

* ``"embedding"``: reconstruct the input embedding from the hidden state, ‖P h_t − e_t‖² / ‖e_t‖² averaged over
  the batch's real tokens (P a learned linear map; the embedding is a fixed target, so the loss cannot be met by
  shrinking the embeddings);
* ``"word"``: predict the input word from the hidden state, cross-entropy of softmax((P h_t) Eᵀ) against the word
  id, with the decoder tied to the model's embedding table E (a masked-language-model-style head without the mask:
  the word must stay recoverable from its own position).

The paper's exact regulariser could not be checked offline here; both forms implement its stated idea (a
word-level objective tying hidden states to input words) and are documented as such.
"""

from __future__ import annotations

from typing import Any, Optional

import torch  # noqa: F401 - the docstring example uses it
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.losses._common import FiniteGuard, as_float, check_weight, require_model, token_mask

__all__ = ["WordTyingLoss"]

MODES = ("embedding", "word")


class WordTyingLoss(FiniteGuard, nn.Module):
    """weight · a word-level tying objective on ``outputs.hidden_states`` (see the module docstring).

    The projection P (``Linear(hidden_dim, embedding_dim)``) is a parameter of this loss; passed as an objective of
    :class:`~lightning_xai.models.AttentionClassifier` it is a child module, so the model's optimizer trains it.

    Args:
        hidden_dim: size of the hidden states the attention pools (2·hidden for a BiLSTM).
        embedding_dim: size of the input embeddings.
        weight: loss weight.
        mode: ``"embedding"`` (reconstruct e_t) or ``"word"`` (predict the word id through the tied embedding table;
            needs a model with an ``embedding`` ``nn.Embedding`` and ``input_ids`` in the batch).
        name: the logged name.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> tie = WordTyingLoss(hidden_dim=8, embedding_dim=8)
        >>> bool(tie(model(batch), batch, model=model) > 0)
        True
    """

    def __init__(
        self, hidden_dim: int, embedding_dim: int, weight: float = 1.0, mode: str = "embedding", name: str = "tying"
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
        weight = check_weight(weight, "WordTyingLoss")
        if hidden_dim < 1 or embedding_dim < 1:
            raise ValueError(f"hidden_dim and embedding_dim must be positive, got {hidden_dim} and {embedding_dim}.")
        self.projection = nn.Linear(hidden_dim, embedding_dim)
        self.weight = float(weight)
        self.mode = mode
        self.name = name

    def forward(self, outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
        explained = require_model(model, "WordTyingLoss")  # model: the holder, which logs
        hidden = outputs.hidden_states
        if hidden is None:
            raise ValueError("WordTyingLoss needs outputs.hidden_states [B, T, H]; this model output has none.")
        if hidden.shape[-1] != self.projection.in_features:
            raise ValueError(
                f"hidden states have size {hidden.shape[-1]} but WordTyingLoss(hidden_dim="
                f"{self.projection.in_features}); pass the encoder's output size (2·hidden_dim for a "
                "BiLSTM)."
            )
        mask = token_mask(outputs, batch, explained).to(hidden.device)
        predicted = self.projection(hidden)
        if self.mode == "embedding":
            value = self._reconstruction(predicted, explained.embed(batch).detach(), mask)
        else:
            value = self._word_prediction(predicted, batch, explained, mask)
        return self.finite_or_zero(self.weight * value, model, hidden_states=hidden)

    def _reconstruction(self, predicted: Tensor, embeddings: Tensor, mask: Tensor) -> Tensor:
        if embeddings.shape[-1] != predicted.shape[-1]:
            raise ValueError(
                f"embeddings have size {embeddings.shape[-1]} but WordTyingLoss(embedding_dim={predicted.shape[-1]})."
            )
        real = as_float(mask, predicted)
        error = ((predicted - embeddings) ** 2).sum(-1)
        scale = (embeddings**2).sum(-1)
        return (error * real).sum() / (scale * real).sum().clamp_min(torch.finfo(predicted.dtype).tiny)

    def _word_prediction(self, predicted: Tensor, batch: Batch, model: Any, mask: Tensor) -> Tensor:
        table: Optional[nn.Embedding] = getattr(model, "embedding", None)
        if not isinstance(table, nn.Embedding) or "input_ids" not in batch:
            raise ValueError(
                "WordTyingLoss(mode='word') ties its decoder to model.embedding (an nn.Embedding) and "
                "reads batch['input_ids']; this model/batch has neither. Use mode='embedding'."
            )
        if table.embedding_dim != predicted.shape[-1]:
            raise ValueError(
                f"model.embedding has {table.embedding_dim} dimensions but WordTyingLoss(embedding_dim="
                f"{predicted.shape[-1]})."
            )
        logits = predicted[mask] @ table.weight.t()
        return nn.functional.cross_entropy(logits, batch["input_ids"].to(mask.device)[mask])

    def extra_repr(self) -> str:
        return f"weight={self.weight}, mode={self.mode!r}"

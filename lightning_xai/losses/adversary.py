"""Wiegreffe & Pinter (2019): a model-consistent adversary whose attention differs from a frozen base."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import Tensor, nn

from lightning_xai.adapters.checks import vocabulary_size
from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput, as_explainable
from lightning_xai.data.vocabulary import token_list
from lightning_xai.losses._common import FiniteGuard, check_weight, log_extra, require_finite, require_model
from lightning_xai.metrics.functional.divergence import jensen_shannon_divergence, kl_divergence, total_variation

__all__ = ["ModelConsistentAdversary", "model_consistent_adversary_loss"]


def model_consistent_adversary_loss(
    adv_logits: Tensor, base_probs: Tensor, adv_attention: Tensor, base_attention: Tensor, weight: float = 1.0
) -> Dict[str, Tensor]:
    """L = mean_b TVD(ŷ_adv, ŷ_base) − λ·mean_b KL(α_adv ‖ α_base), with the terms (KL, JSD, TVD) for logging.

    λ is ``weight``.

    Raises:
        ValueError: a weight that is not a finite number >= 0, or NaN or infinite logits or attention.

    Example:
        >>> terms = model_consistent_adversary_loss(torch.zeros(1, 2), torch.tensor([[0.5, 0.5]]),
        ...                                         torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]]), 1.0)
        >>> round(terms["loss"].item(), 4), round(terms["kl"].item(), 4)
        (-0.6931, 0.6931)
    """
    owner = "model_consistent_adversary_loss"
    weight = check_weight(weight, owner)
    require_finite(
        owner, adv_logits=adv_logits, base_probs=base_probs, adv_attention=adv_attention, base_attention=base_attention
    )
    return _adversary_terms(adv_logits, base_probs, adv_attention, base_attention, weight)


def _adversary_terms(
    adv_logits: Tensor, base_probs: Tensor, adv_attention: Tensor, base_attention: Tensor, weight: float
) -> Dict[str, Tensor]:
    tvd = total_variation(adv_logits.softmax(-1), base_probs, check=False).mean()
    kl = kl_divergence(adv_attention, base_attention, check=False).mean()
    jsd = jensen_shannon_divergence(adv_attention, base_attention, check=False).mean()
    return {"loss": tvd - weight * kl, "tvd": tvd, "kl": kl, "jsd": jsd}


class ModelConsistentAdversary(FiniteGuard, nn.Module):
    """Wiegreffe & Pinter's model-consistent adversarial objective against a frozen base model.

    L = TVD(ŷ_adv, ŷ_base) − λ·KL(α_adv ‖ α_base), averaged over the batch, where TVD = ½Σ_c|p_c − q_c| over
    all classes. (Wiegreffe & Pinter's code used |p₁ − q₁| on the positive class only; for two classes the
    two are equal, for more classes this one is the proper distance between the predicted distributions.)
    Minimising it keeps the adversary's predictions on the base's while pushing its attention away.

    The base model is frozen: it is held outside this module's parameters (so it is never in an optimiser,
    never in a checkpoint of the adversary, never switched to train mode by ``adversary.train()``), evaluated
    in ``eval()`` mode under ``torch.no_grad()``, and its parameters get ``requires_grad=False``. It is moved to
    the adversary's device on first use.

    Use it as an objective of the adversary — the adversary typically starts from the base's checkpoint — and
    drop the cross-entropy on gold labels (the adversary follows the base, not the labels); see
    ``examples/adversary_sst2.py``. Each call logs ``train/<name>_kl``, ``_jsd`` and ``_tvd`` under a Trainer
    and keeps them in :attr:`last_terms`.

    Args:
        base_model: the audited model (an ExplainableModel, or a module holding one, e.g. a LightningModule with a
            ``transformers`` sequence classifier: see :func:`~lightning_xai.losses._common.require_model`).
        weight: λ, weight of the attention divergence.
        name: the logged name.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> base = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> adversary = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> objective = ModelConsistentAdversary(base, weight=0.1)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> loss = objective(adversary(batch), batch)
        >>> loss.backward()
        >>> all(p.grad is None for p in base.parameters()), sorted(objective.last_terms)
        (True, ['jsd', 'kl', 'tvd'])
    """

    def __init__(self, base_model: ExplainableModel, weight: float = 1.0, name: str = "adversary") -> None:
        super().__init__()
        base = as_explainable(require_model(base_model, "ModelConsistentAdversary"))  # or the model it holds
        weight = check_weight(weight, "ModelConsistentAdversary")
        self._base = (base,)  # a tuple keeps it out of this module's children and parameters
        if isinstance(base, nn.Module):
            base.eval()
            for p in base.parameters():
                p.requires_grad_(False)
        self.weight = float(weight)
        self.name = name
        self.last_terms: Dict[str, Tensor] = {}
        self._vocabulary_checked = False

    @property
    def base_model(self) -> ExplainableModel:
        """The frozen base model."""
        return self._base[0]

    def base_outputs(self, batch: Batch, device: Optional[torch.device] = None) -> ExplainOutput:
        """The base's output on ``batch`` (eval mode, no gradients)."""
        base = self.base_model
        if isinstance(base, nn.Module):
            base.eval()
            if device is not None:
                first = next(base.parameters(), None)
                if first is not None and first.device != device:
                    base.to(device)
        with torch.no_grad():
            return base.forward_from_embeddings(base.embed(batch), batch)

    def check_vocabulary(self, model: Any) -> None:
        """Raise a ValueError unless ``model`` (the adversary) reads the base's token ids: same embedding-table
        size and, when both carry one, the same vocabulary list. Run on the first call with a model.

        Example:
            >>> from lightning_xai.models import AttentionClassifier
            >>> objective = ModelConsistentAdversary(AttentionClassifier(vocab_size=20, num_classes=2))
            >>> objective.check_vocabulary(AttentionClassifier(vocab_size=30, num_classes=2))
            Traceback (most recent call last):
            ...
            ValueError: ModelConsistentAdversary: the base model's embedding table has 20 rows but the adversary's has 30: they read different vocabularies, so the same input_ids mean different words. Build the adversary from the base (its checkpoint, or the data module the base was trained with) so both share one vocabulary.
        """
        base = self.base_model
        sizes = vocabulary_size(base), vocabulary_size(model)
        fix = (
            "Build the adversary from the base (its checkpoint, or the data module the base was trained with) so "
            "both share one vocabulary."
        )
        if None not in sizes and sizes[0] != sizes[1]:
            raise ValueError(
                f"ModelConsistentAdversary: the base model's embedding table has {sizes[0]} rows but "
                f"the adversary's has {sizes[1]}: they read different vocabularies, so the same "
                f"input_ids mean different words. {fix}"
            )
        words = token_list(getattr(base, "vocab", None)), token_list(getattr(model, "vocab", None))  # list or dict
        if None not in words and words[0] != words[1]:
            raise ValueError(
                "ModelConsistentAdversary: the base model and the adversary carry different vocabulary "
                f"lists (same size, other words): the same input_ids mean different words. {fix}"
            )

    def forward(self, outputs: ExplainOutput, batch: Batch, model: Any = None) -> Tensor:
        if model is not None and not self._vocabulary_checked:
            self.check_vocabulary(model)
            self._vocabulary_checked = True
        base = self.base_outputs(batch, outputs.logits.device)
        if base.attention.shape != outputs.attention.shape:
            raise ValueError(
                f"The base's attention has shape {tuple(base.attention.shape)} but the adversary's "
                f"has {tuple(outputs.attention.shape)}; both must read the same tokenisation."
            )
        base_probs = base.logits.softmax(-1).to(outputs.logits.dtype)
        terms = _adversary_terms(
            outputs.logits, base_probs, outputs.attention, base.attention.to(outputs.attention.dtype), self.weight
        )
        self.last_terms = {k: v.detach() for k, v in terms.items() if k != "loss"}
        for key, value in self.last_terms.items():
            log_extra(model, f"train/{self.name}_{key}", value, int(outputs.logits.shape[0]))
        return self.finite_or_zero(
            terms["loss"],
            model,
            logits=outputs.logits,
            attention=outputs.attention,
            base_logits=base.logits,
            base_attention=base.attention,
        )

    def extra_repr(self) -> str:
        return f"weight={self.weight}, base={type(self.base_model).__name__}"

"""Training objectives that expose or fix unfaithful attention.

Every loss is an ``nn.Module`` with a ``name`` and ``forward(outputs, batch, model=None) -> scalar``: pass it
to ``AttentionClassifier(objectives=[...])`` (logged as ``train/<name>``) or add it in one line of your own
``training_step``: ``loss = ce + penalty(outputs, batch)``.
"""

from lightning_xai.losses.adversary import ModelConsistentAdversary, model_consistent_adversary_loss
from lightning_xai.losses.alignment import AttentionAlignmentLoss, attention_alignment_kl, normalize_saliency
from lightning_xai.losses.conicity import ConicityLoss, conicity
from lightning_xai.losses.deception import DeceptionPenalty, deception_penalty, impermissible_mass
from lightning_xai.losses.erasure import ErasureFaithfulnessLoss, soft_top_k_mask
from lightning_xai.losses.rationale import RationaleSupervisionLoss, rationale_supervision
from lightning_xai.losses.tying import WordTyingLoss

__all__ = [
    "AttentionAlignmentLoss",
    "ConicityLoss",
    "DeceptionPenalty",
    "ErasureFaithfulnessLoss",
    "ModelConsistentAdversary",
    "attention_alignment_kl",
    "conicity",
    "deception_penalty",
    "impermissible_mass",
    "model_consistent_adversary_loss",
    "normalize_saliency",
    "soft_top_k_mask",
    "RationaleSupervisionLoss",
    "WordTyingLoss",
    "rationale_supervision",
]

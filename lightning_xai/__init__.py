"""lightning_xai: audit attention explanations while a model trains."""
from lightning_xai.adapters import ExplainableModel, ExplainOutput, HookAdapter, HuggingFaceAdapter, as_explainable
from lightning_xai.attribution import attribute, explanation_context
from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit, ImpermissibleAttentionMonitor
from lightning_xai.callbacks import SanityCheck
from lightning_xai.data import TextClassificationDataModule, Vocabulary
from lightning_xai.losses import (AttentionAlignmentLoss, ConicityLoss, DeceptionPenalty, ErasureFaithfulnessLoss,
                                  ModelConsistentAdversary)
from lightning_xai.metrics import AOPC, Comprehensiveness, DecisionFlip, JensenShannon, KendallTau, Sufficiency
from lightning_xai.models import AttentionClassifier, HFClassifier
from lightning_xai.reporting import AuditReport

__version__ = "0.1.0"

__all__ = ["AOPC", "Comprehensiveness", "DecisionFlip", "JensenShannon", "KendallTau", "Sufficiency",
           "AttentionClassifier", "ExplainOutput", "ExplainableModel", "TextClassificationDataModule",
           "Vocabulary", "as_explainable", "attribute", "explanation_context",
           "AttentionAudit", "AttentionBaselines", "AuditReport", "ErasureAudit", "ImpermissibleAttentionMonitor",
           "AttentionAlignmentLoss", "ConicityLoss", "DeceptionPenalty", "ErasureFaithfulnessLoss",
           "ModelConsistentAdversary", "HFClassifier", "HookAdapter", "HuggingFaceAdapter", "SanityCheck"]

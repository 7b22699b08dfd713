"""lightning_xai: audit attention explanations while a model trains.

The top level names what a training script uses, each once: every public audit callback, loss and metric class,
the adapters and their protocol, :func:`attribute` (with :func:`explanation_context`), the data modules, the
reference models and :class:`AuditReport`. Everything else lives in its subpackage (``lightning_xai.callbacks``,
``lightning_xai.losses``, ``lightning_xai.metrics``, ...), whose ``__all__`` lists it.
"""

from lightning_xai.adapters import ExplainableModel, ExplainOutput, HookAdapter, HuggingFaceAdapter, as_explainable
from lightning_xai.attribution import attribute, explanation_context
from lightning_xai.callbacks import (
    AdversarialSearchAudit,
    AlignmentAudit,
    AttentionAudit,
    AttentionBaselines,
    ErasureAudit,
    ImpermissibleAttentionMonitor,
    RandomStateCheckpoint,
    SanityCheck,
)
from lightning_xai.data import HFTextClassificationDataModule, TextClassificationDataModule, Vocabulary
from lightning_xai.losses import (
    AttentionAlignmentLoss,
    ConicityLoss,
    DeceptionPenalty,
    ErasureFaithfulnessLoss,
    ModelConsistentAdversary,
    RationaleSupervisionLoss,
    WordTyingLoss,
)
from lightning_xai.metrics import (
    AOPC,
    AUPRC,
    IOUF1,
    AlignmentErrorRate,
    Comprehensiveness,
    DecisionFlip,
    JensenShannon,
    KendallTau,
    PearsonCorrelation,
    SpearmanCorrelation,
    Sufficiency,
    TokenF1,
    TopKKendallTau,
    TopKOverlap,
)
from lightning_xai.models import AttentionClassifier, HFClassifier
from lightning_xai.reporting import AuditReport

__version__ = "0.1.0"

__all__ = [
    # adapters
    "ExplainOutput",
    "ExplainableModel",
    "HookAdapter",
    "HuggingFaceAdapter",
    "as_explainable",
    # attribution
    "attribute",
    "explanation_context",
    # callbacks
    "AdversarialSearchAudit",
    "AlignmentAudit",
    "AttentionAudit",
    "AttentionBaselines",
    "ErasureAudit",
    "ImpermissibleAttentionMonitor",
    "RandomStateCheckpoint",
    "SanityCheck",
    # data
    "HFTextClassificationDataModule",
    "TextClassificationDataModule",
    "Vocabulary",
    # losses
    "AttentionAlignmentLoss",
    "ConicityLoss",
    "DeceptionPenalty",
    "ErasureFaithfulnessLoss",
    "ModelConsistentAdversary",
    "RationaleSupervisionLoss",
    "WordTyingLoss",
    # metrics
    "AOPC",
    "AUPRC",
    "AlignmentErrorRate",
    "Comprehensiveness",
    "DecisionFlip",
    "IOUF1",
    "JensenShannon",
    "KendallTau",
    "PearsonCorrelation",
    "SpearmanCorrelation",
    "Sufficiency",
    "TokenF1",
    "TopKKendallTau",
    "TopKOverlap",
    # models
    "AttentionClassifier",
    "HFClassifier",
    # reporting
    "AuditReport",
]

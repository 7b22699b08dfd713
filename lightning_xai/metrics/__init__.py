"""torchmetrics ``Metric`` classes for explanations, each with a functional twin in
:mod:`lightning_xai.metrics.functional`; per instance over real tokens, DDP-reducible (sum states).

* agreement of two maps: :class:`KendallTau`, :class:`TopKKendallTau`, :class:`SpearmanCorrelation`,
  :class:`PearsonCorrelation`, :class:`JensenShannon`, :class:`TopKOverlap`;
* faithfulness: :class:`Comprehensiveness`, :class:`Sufficiency`, :class:`AOPC` (ERASER, token deletion),
  :class:`DecisionFlip` (Serrano & Smith, attention erasure);
* plausibility against human rationales: :class:`TokenF1`, :class:`IOUF1`, :class:`AUPRC`;
* word alignment against human links (corpus level, not per instance): :class:`AlignmentErrorRate`.
"""

from lightning_xai.metrics._base import InstanceMeanMetric, ValueMean, summarize_values
from lightning_xai.metrics.agreement import (
    JensenShannon,
    KendallTau,
    PearsonCorrelation,
    SpearmanCorrelation,
    TopKKendallTau,
    TopKOverlap,
)
from lightning_xai.metrics.alignment import AlignmentErrorRate
from lightning_xai.metrics.faithfulness import AOPC, Comprehensiveness, DecisionFlip, Sufficiency
from lightning_xai.metrics.plausibility import AUPRC, IOUF1, TokenF1

__all__ = [
    "AOPC",
    "AUPRC",
    "AlignmentErrorRate",
    "Comprehensiveness",
    "DecisionFlip",
    "IOUF1",
    "InstanceMeanMetric",
    "JensenShannon",
    "KendallTau",
    "PearsonCorrelation",
    "SpearmanCorrelation",
    "Sufficiency",
    "TokenF1",
    "TopKKendallTau",
    "TopKOverlap",
    "ValueMean",
    "summarize_values",
]

"""Lightning callbacks that audit attention explanations while a model trains.

* :class:`AttentionAudit` — agreement of attention with saliency maps, and of the maps with each other.
* :class:`ErasureAudit` — Serrano & Smith's decision flips and ERASER comprehensiveness/sufficiency/AOPC.
* :class:`AttentionBaselines` — Jain & Wallace's permutation test and Wiegreffe & Pinter's uniform attention.
* :class:`AlignmentAudit` — AER of the word alignments a generator's attention and saliency maps induce.
* :class:`AdversarialSearchAudit` — Jain & Wallace's per-instance adversarial attention search (JSD distribution).
* :class:`ImpermissibleAttentionMonitor` — attention mass on impermissible tokens (deception audits).
* :class:`SanityCheck` — saliency sanity checks (input invariance, parameter randomisation, completeness).
* :class:`RandomStateCheckpoint` — checkpoints the global random states so a resumed run continues them (opt-in).
* :class:`AuditCallback` — the base class (cadence, fixed audit subset, non-invasiveness, state, logging), with
  the result types: :class:`BatchResult` (what ``audit_batch`` returns), :class:`AuditPrediction` (the shared
  prediction step), :class:`AuditExample` (one audited example), :class:`TokenPairs` (its strongest token-pair
  interactions) and :class:`AuditResult` (one audit run).

One module per callback; their shared machinery is the private package ``lightning_xai.callbacks._audit``.
Constants and helpers live in their modules, e.g. ``lightning_xai.callbacks.attention_audit.DEFAULT_METHODS``.
"""

from lightning_xai.callbacks.adversarial_search import AdversarialSearchAudit
from lightning_xai.callbacks.alignment_audit import AlignmentAudit
from lightning_xai.callbacks.attention_audit import AttentionAudit
from lightning_xai.callbacks.attention_baselines import AttentionBaselines
from lightning_xai.callbacks.base import (
    AuditCallback,
    AuditExample,
    AuditPrediction,
    AuditResult,
    BatchResult,
    TokenPairs,
)
from lightning_xai.callbacks.erasure_audit import ErasureAudit
from lightning_xai.callbacks.impermissible import ImpermissibleAttentionMonitor
from lightning_xai.callbacks.random_state import RandomStateCheckpoint
from lightning_xai.callbacks.sanity import SanityCheck

__all__ = [
    "AdversarialSearchAudit",
    "AlignmentAudit",
    "AttentionAudit",
    "AttentionBaselines",
    "AuditCallback",
    "AuditExample",
    "AuditPrediction",
    "AuditResult",
    "BatchResult",
    "ErasureAudit",
    "ImpermissibleAttentionMonitor",
    "RandomStateCheckpoint",
    "SanityCheck",
    "TokenPairs",
]

"""Lightning callbacks that audit attention explanations while a model trains.

* :class:`AttentionAudit` — agreement of attention with saliency maps, and of the maps with each other.
* :class:`ErasureAudit` — Serrano & Smith's decision flips and ERASER comprehensiveness/sufficiency/AOPC.
* :class:`AttentionBaselines` — Jain & Wallace's permutation test and Wiegreffe & Pinter's uniform attention.
* :class:`AdversarialSearchAudit` — Jain & Wallace's per-instance adversarial attention search (JSD distribution).
* :class:`ImpermissibleAttentionMonitor` — attention mass on impermissible tokens (deception audits).
* :class:`SanityCheck` — saliency sanity checks (input invariance, parameter randomisation, completeness).
* :class:`RandomStateCheckpoint` — checkpoints the global random states so a resumed run continues them (opt-in).
* :class:`AuditCallback` — the shared machinery (cadence, fixed audit subset, non-invasiveness, state, logging).
"""
from lightning_xai.callbacks.adversarial_search import AdversarialSearchAudit
from lightning_xai.callbacks.attention_audit import (AGREEMENT_METRICS, DEFAULT_GRADIENT_METHODS, DEFAULT_METHODS,
                                                     AttentionAudit)
from lightning_xai.callbacks.attention_baselines import AttentionBaselines
from lightning_xai.callbacks.erasure_audit import ErasureAudit
from lightning_xai.callbacks._audit.guard import audit_guard
from lightning_xai.callbacks.base import AuditCallback, AuditExample, AuditPrediction, AuditResult, BatchResult
from lightning_xai.metrics import summarize_values
from lightning_xai.callbacks.impermissible import ImpermissibleAttentionMonitor
from lightning_xai.callbacks.random_state import RandomStateCheckpoint
from lightning_xai.callbacks.sanity import SanityCheck

__all__ = ["AGREEMENT_METRICS", "DEFAULT_GRADIENT_METHODS", "DEFAULT_METHODS", "AdversarialSearchAudit", "AttentionAudit", "AttentionBaselines", "AuditCallback",
           "AuditExample", "AuditPrediction", "AuditResult", "BatchResult", "ErasureAudit", "ImpermissibleAttentionMonitor", "RandomStateCheckpoint", "SanityCheck", "audit_guard",
           "summarize_values"]

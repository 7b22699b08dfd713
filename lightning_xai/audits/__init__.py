"""Interventions on a model's attention and inputs, and sanity checks of saliency methods.

Permuted/uniform attention (:mod:`~lightning_xai.audits.baselines`), the erasure decision flip
(:mod:`~lightning_xai.audits.erasure`), the adversarial attention search, seed variance and the sanity checks. The
diagnostic MLP (``DiagnosticMLP``, ``diagnostic_audit``, ``evaluate_classifier``) is a model and lives in
:mod:`lightning_xai.models.diagnostic`.
"""

from lightning_xai.audits.adversarial import (
    AdversarialSearchResult,
    adversarial_attention_search,
    jensen_shannon_divergence,
    kl_divergence,
    summarize_search,
    total_variation,
)
from lightning_xai.audits.erasure import (
    RANKINGS,
    DecisionFlipResult,
    attention_gradient,
    decision_flip,
    erase_tokens,
    erasure_probabilities,
    ranking_scores,
)
from lightning_xai.audits.sanity import (
    SanityTable,
    completeness,
    input_invariance,
    model_randomization,
    run_sanity_checks,
    shifted_model,
)
from lightning_xai.audits.seed_variance import SeedVarianceResult, attention_divergence, seed_variance

__all__ = [
    "RANKINGS",
    "DecisionFlipResult",
    "attention_gradient",
    "decision_flip",
    "erase_tokens",
    "erasure_probabilities",
    "ranking_scores",
    "SanityTable",
    "completeness",
    "input_invariance",
    "model_randomization",
    "run_sanity_checks",
    "shifted_model",
    "AdversarialSearchResult",
    "adversarial_attention_search",
    "jensen_shannon_divergence",
    "kl_divergence",
    "summarize_search",
    "total_variation",
    "SeedVarianceResult",
    "attention_divergence",
    "seed_variance",
]

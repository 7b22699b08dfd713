"""audits."""
from lightning_xai.audits.erasure import (RANKINGS, DecisionFlipResult, attention_gradient, decision_flip,
                                          erase_tokens, erasure_probabilities, ranking_scores)
from lightning_xai.audits.sanity import (SanityTable, completeness, input_invariance, model_randomization,
                                         run_sanity_checks, shifted_model)

__all__ = ["RANKINGS", "DecisionFlipResult", "attention_gradient", "decision_flip", "erase_tokens",
           "erasure_probabilities", "ranking_scores",
           "SanityTable", "completeness", "input_invariance", "model_randomization", "run_sanity_checks",
           "shifted_model"]

"""audits."""
from lightning_xai.audits.erasure import (RANKINGS, DecisionFlipResult, attention_gradient, decision_flip,
                                          erase_tokens, erasure_probabilities, ranking_scores)

__all__ = ["RANKINGS", "DecisionFlipResult", "attention_gradient", "decision_flip", "erase_tokens",
           "erasure_probabilities", "ranking_scores"]

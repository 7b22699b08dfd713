"""Erasure interventions: delete tokens (ERASER) and erase attention items until the decision flips (Serrano &
Smith, 2019).

The interventions are primitives the metrics build on, so they live below this layer and are re-exported here:
:func:`erase_tokens` in :mod:`lightning_xai.attribution.batching` (every per-token tensor of the batch shifts with
the deleted tokens), :func:`erasure_probabilities`, :func:`attention_gradient` and :func:`ranking_scores` in
:mod:`lightning_xai.metrics.functional.erasure`, :func:`decision_flip` in
:mod:`lightning_xai.metrics.functional.decision_flips`.
"""

from lightning_xai.attribution.batching import erase_tokens
from lightning_xai.metrics.functional.decision_flips import DecisionFlipResult, decision_flip
from lightning_xai.metrics.functional.erasure import (
    RANKINGS,
    attention_gradient,
    erasure_probabilities,
    ranking_scores,
)

__all__ = [
    "RANKINGS",
    "DecisionFlipResult",
    "attention_gradient",
    "decision_flip",
    "erase_tokens",
    "erasure_probabilities",
    "ranking_scores",
]

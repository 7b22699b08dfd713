"""Functional metrics: one value per instance, computed over its real tokens, vectorised over the batch.

* agreement between two score maps: :func:`kendall_tau`, :func:`topk_kendall_tau`, :func:`spearman`,
  :func:`pearson`, :func:`jensen_shannon`, :func:`topk_overlap`;
* faithfulness by deleting tokens (ERASER): :func:`comprehensiveness`, :func:`sufficiency`, :func:`aopc`;
* plausibility against a human rationale: :func:`token_f1`, :func:`iou_f1`, :func:`auprc`; the attention mass on
  marked tokens, :func:`impermissible_mass`;
* divergences of distributions (:mod:`~lightning_xai.metrics.functional.divergence`): :func:`kl_divergence`,
  :func:`jensen_shannon_divergence`, :func:`total_variation`; erasure measurements
  (:mod:`~lightning_xai.metrics.functional.erasure`): :func:`erasure_probabilities`, :func:`decision_flip`;
* word alignment against human links (:mod:`~lightning_xai.metrics.functional.alignment`, corpus level):
  :func:`alignment_error_rate`, :func:`alignment_scores`, :func:`alignment_counts`; score maps to links
  (:mod:`~lightning_xai.metrics.functional.alignment_extraction`): :func:`extract_links`, :func:`pool_to_words`.
"""

from lightning_xai.metrics.functional.agreement import (
    jensen_shannon,
    jw_top_k,
    kendall_tau,
    pearson,
    spearman,
    topk_kendall_tau,
    topk_overlap,
)
from lightning_xai.metrics.functional.alignment import (
    AlignmentCounts,
    alignment_counts,
    alignment_error_rate,
    alignment_scores,
    alignment_scores_from_counts,
    link_set,
    links_to_matrix,
)
from lightning_xai.metrics.functional.alignment_extraction import (
    LINK_RULES,
    WORD_POOLINGS,
    extract_links,
    pool_to_words,
)
from lightning_xai.metrics.functional.decision_flips import decision_flip
from lightning_xai.metrics.functional.divergence import jensen_shannon_divergence, kl_divergence, total_variation
from lightning_xai.metrics.functional.erasure import erasure_probabilities
from lightning_xai.metrics.functional.faithfulness import (
    AOPC_BINS,
    aopc,
    comprehensiveness,
    erasure_scores,
    rationale_mask,
    sufficiency,
)
from lightning_xai.metrics.functional.plausibility import (
    auprc,
    binarize,
    impermissible_mass,
    iou_f1,
    span_match_counts,
    token_f1,
)

__all__ = [
    "AOPC_BINS",
    "AlignmentCounts",
    "LINK_RULES",
    "WORD_POOLINGS",
    "alignment_counts",
    "alignment_error_rate",
    "alignment_scores",
    "alignment_scores_from_counts",
    "aopc",
    "auprc",
    "binarize",
    "comprehensiveness",
    "decision_flip",
    "erasure_probabilities",
    "erasure_scores",
    "extract_links",
    "impermissible_mass",
    "iou_f1",
    "jensen_shannon",
    "jensen_shannon_divergence",
    "jw_top_k",
    "kendall_tau",
    "kl_divergence",
    "link_set",
    "links_to_matrix",
    "pearson",
    "pool_to_words",
    "rationale_mask",
    "span_match_counts",
    "spearman",
    "sufficiency",
    "token_f1",
    "topk_kendall_tau",
    "topk_overlap",
    "total_variation",
]

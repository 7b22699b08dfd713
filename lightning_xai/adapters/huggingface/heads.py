"""What a ``transformers`` sequence classifier's head computes, read from its config the way ``transformers`` does.

``*ForSequenceClassification`` models choose their loss from ``config.problem_type``, and when it is unset from
``num_labels`` (1: regression) and the labels' dtype (integers: one class, floats: multi-label). Without labels the
dtype is unknown, so an unset ``problem_type`` with more than one label is read as single-label (softmax), as
``transformers``' ``pipeline`` reads it; set ``config.problem_type = "multi_label_classification"`` for a
multi-label model (``from_pretrained(..., problem_type=...)``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROBLEM_TYPES", "head_kind"]

#: ``config.problem_type`` -> the :class:`~lightning_xai.adapters.capabilities.HeadKind` it means
PROBLEM_TYPES = {
    "regression": "regression",
    "single_label_classification": "softmax",
    "multi_label_classification": "sigmoid",
}


def head_kind(config: Any) -> str:
    """``"regression"``, ``"sigmoid"`` or ``"softmax"`` for a sequence classifier's ``config``.

    Raises:
        ValueError: a ``problem_type`` ``transformers`` does not know either.

    Example:
        >>> from transformers import BertConfig
        >>> head_kind(BertConfig(num_labels=1)), head_kind(BertConfig(num_labels=3))
        ('regression', 'softmax')
        >>> head_kind(BertConfig(num_labels=3, problem_type="multi_label_classification"))
        'sigmoid'
    """
    problem = getattr(config, "problem_type", None)
    if problem is None:
        return "regression" if getattr(config, "num_labels", 2) == 1 else "softmax"
    if problem not in PROBLEM_TYPES:
        raise ValueError(
            f"config.problem_type={problem!r} is not one transformers knows; use one of {sorted(PROBLEM_TYPES)}."
        )
    return PROBLEM_TYPES[problem]

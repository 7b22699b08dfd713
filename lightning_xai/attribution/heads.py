"""What a model's head makes of its logits: the score an explanation explains by default (:func:`default_output`), in
words (:func:`explained_quantity`), the decisions it takes (:func:`decisions`, :func:`label_targets`), and the
refusal of measures defined only for a softmax classifier (:func:`check_softmax_head`). The scores themselves are
:func:`~lightning_xai.attribution.targets.score_values`."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import HEAD_KINDS, head_kind_of
from lightning_xai.attribution.targets import score_values

__all__ = ["check_softmax_head", "decisions", "default_output", "explained_quantity", "label_targets"]


def default_output(model: Any) -> str:
    """The ``output=`` that explains ``model``'s decision: ``"logit"`` (the value) for a regression head, else
    ``"probability"``.

    Example:
        >>> from torch import nn
        >>> class Scorer(nn.Module):
        ...     head_kind = "regression"
        >>> default_output(Scorer()), default_output(nn.Linear(2, 2))
        ('logit', 'probability')
    """
    return "logit" if head_kind_of(model) == "regression" else "probability"


def explained_quantity(model: Any, output: Optional[str] = None) -> str:
    """In words, the quantity an explanation of ``model`` with ``output=`` explains (for logs and reports;
    ``None``: :func:`default_output`).

    Raises:
        ValueError: as :func:`score_values` (a probability of a regression head).

    Example:
        >>> from torch import nn
        >>> explained_quantity(nn.Linear(2, 2)), explained_quantity(nn.Linear(2, 2), "logit")
        ('softmax probability of the target class', 'logit of the target class')
        >>> class Labels(nn.Module):
        ...     head_kind = "sigmoid"
        >>> explained_quantity(Labels())
        'sigmoid probability of the target label'
    """
    head = head_kind_of(model)
    output = default_output(model) if output is None else output
    score_values(torch.zeros(1, 1), output, head)  # refuses what is not defined, with the message
    if head == "regression":
        return "regression output value"
    unit = "label" if head == "sigmoid" else "class"
    name = {"probability": f"{head} probability", "log_probability": f"log-{head} probability", "logit": "logit"}[
        output
    ]
    return f"{name} of the target {unit}"


def decisions(logits: Tensor, head: str = "softmax") -> Tensor:
    """The model's decision on each row: ``LongTensor[B]`` the argmax class (softmax), ``BoolTensor[B, C]`` the set
    of labels whose sigmoid exceeds 0.5 (sigmoid). A decision flips when this changes.

    Raises:
        ValueError: a regression head makes no decision (nothing can flip).

    Example:
        >>> logits = torch.tensor([[0.5, -1.0, 2.0]])
        >>> decisions(logits, "softmax"), decisions(logits, "sigmoid")
        (tensor([2]), tensor([[ True, False,  True]]))
    """
    if head == "regression":
        raise ValueError(
            "a regression head makes no decision (its outputs are values): a decision flip is not "
            "defined for it; measure the change of the output value instead (comprehensiveness and "
            "sufficiency with output='logit')."
        )
    if head == "sigmoid":
        return logits.detach() > 0
    if head != "softmax":
        raise ValueError(f"Unknown head {head!r}; choose one of {list(HEAD_KINDS)}.")
    return logits.detach().argmax(dim=-1)


def check_softmax_head(model: Any, measure: str) -> None:
    """Raise a ValueError naming ``measure`` unless ``model`` is a softmax classifier.

    For the measures defined on one categorical output distribution (the total variation between two softmax
    outputs, an argmax flip): a sigmoid head's labels are not one distribution and a regression head has none, so
    such a measure would be a silent wrong number there.

    Example:
        >>> from torch import nn
        >>> class Scorer(nn.Module):
        ...     head_kind = "regression"
        >>> check_softmax_head(nn.Linear(2, 2), "the permutation test")
        >>> check_softmax_head(Scorer(), "the permutation test")
        Traceback (most recent call last):
        ...
        ValueError: the permutation test compares softmax output distributions, but Scorer has a regression head (head_kind='regression'); it is defined for softmax classifiers only. Its attributions (with output='logit') and ERASER faithfulness work on this head.
    """
    head = head_kind_of(model)
    if head == "softmax":
        return
    works = (
        "Its attributions (with output='logit') and ERASER faithfulness work on this head."
        if head == "regression"
        else "Its attributions, ERASER faithfulness and decision flips (label-set changes) work on this head."
    )
    raise ValueError(
        f"{measure} compares softmax output distributions, but {type(model).__name__} has a {head} head "
        f"(head_kind={head!r}); it is defined for softmax classifiers only. {works}"
    )


def label_targets(logits: Tensor, head: str = "sigmoid") -> Tuple[Tensor, Tensor]:
    """``(rows, labels)``: every predicted label of every row, as pairs to explain one at a time.

    Sigmoid: each label whose probability exceeds 0.5 (a row with none contributes nothing); softmax: the argmax
    class of each row. Explain them with ``attribute(model, gather_rows(batch, rows, B), target=labels)``.

    Example:
        >>> label_targets(torch.tensor([[2.0, -1.0, 0.5], [-3.0, -2.0, -1.0]]))
        (tensor([0, 0]), tensor([0, 2]))
    """
    chosen = decisions(logits, head)
    if head == "softmax":
        return torch.arange(logits.shape[0], device=logits.device), chosen
    pairs = chosen.nonzero()
    return pairs[:, 0], pairs[:, 1]

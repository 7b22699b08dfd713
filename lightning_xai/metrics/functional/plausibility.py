"""Plausibility: agreement of a token score map with a human rationale mask (ERASER, DeYoung et al. 2020).

All functions take ``scores`` ``[B, T]``, ``rationale`` ``[B, T]`` bool (the human-marked tokens) and ``mask``
``[B, T]`` bool (real tokens); positions outside ``mask`` are ignored in both.

Turning a soft map into a hard rationale (:func:`binarize`): exactly one of

* ``k``: the top-k real tokens (an int, or a fraction in (0, 1] of each instance's length, ≥ 1 token);
* ``threshold``: the real tokens whose score is ≥ ``threshold``;
* neither: the top-``g`` tokens, g = the number of human rationale tokens of the instance (the "oracle length"
  reading used when a method has no natural cut-off; instances with no rationale token then predict nothing).

Ties in top-k are broken by position (earlier first).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.checks import check_attention_distribution
from lightning_xai.metrics.functional._validation import (
    check_distributions,
    check_maps,
    check_mask,
    resolve_k,
    topk_mask,
)

__all__ = ["auprc", "binarize", "impermissible_mass", "iou_f1", "span_match_counts", "token_f1"]


def _check_rationale(rationale: Tensor, mask: Tensor) -> None:
    if not isinstance(rationale, Tensor) or rationale.dtype != torch.bool:
        raise TypeError(
            "rationale must be a bool tensor [B, T] (True at human-marked tokens); got "
            f"{rationale.dtype if isinstance(rationale, Tensor) else type(rationale).__name__}."
        )
    if rationale.shape != mask.shape:
        raise ValueError(f"rationale has shape {tuple(rationale.shape)} but mask is {tuple(mask.shape)}.")


def binarize(
    scores: Tensor,
    mask: Tensor,
    rationale: Optional[Tensor] = None,
    *,
    k: Optional[Union[int, float]] = None,
    threshold: Optional[float] = None,
) -> Tensor:
    """``[B, T]`` bool hard rationale from a soft map (see the module docstring for the rule).

    Example:
        >>> import torch
        >>> binarize(torch.tensor([[0.9, 0.1, 0.5]]), torch.ones(1, 3, dtype=torch.bool), threshold=0.5)
        tensor([[ True, False,  True]])
    """
    check_maps(scores, mask=mask, names=("scores",))
    if k is not None and threshold is not None:
        raise ValueError("Give either k (top-k tokens) or threshold (score >= threshold), not both.")
    if threshold is not None:
        return (scores >= threshold) & mask
    if k is not None:
        return topk_mask(scores, mask, resolve_k(k, mask.sum(1)))
    if rationale is None:
        raise ValueError(
            "Without k or threshold the predicted rationale takes as many tokens as the human one; "
            "pass rationale, k or threshold."
        )
    _check_rationale(rationale, mask)
    return topk_mask(scores, mask, (rationale & mask).sum(1))


def token_f1(
    scores: Tensor,
    rationale: Tensor,
    mask: Tensor,
    *,
    k: Optional[Union[int, float]] = None,
    threshold: Optional[float] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Token-level precision, recall and F1 of the binarised map against the rationale, per instance (``[B]`` each).

    As ERASER (and ``sklearn.metrics.precision_recall_fscore_support`` on one instance): precision is 0 when
    nothing is predicted, recall is 0 when the instance has no rationale token, F1 is 0 when P + R = 0.

    Example:
        >>> import torch
        >>> p, r, f = token_f1(torch.tensor([[0.9, 0.8, 0.1, 0.0]]), torch.tensor([[True, False, True, False]]),
        ...                    torch.ones(1, 4, dtype=torch.bool), k=2)
        >>> p, r, f
        (tensor([0.5000], dtype=torch.float64), tensor([0.5000], dtype=torch.float64), tensor([0.5000], dtype=torch.float64))
    """
    check_maps(scores, mask=mask, names=("scores",))
    _check_rationale(rationale, mask)
    pred = binarize(scores, mask, rationale, k=k, threshold=threshold)
    gold = rationale & mask
    tp = (pred & gold).sum(1).double()
    n_pred, n_gold = pred.sum(1).double(), gold.sum(1).double()
    precision = torch.where(n_pred > 0, tp / n_pred.clamp(min=1), torch.zeros_like(tp))
    recall = torch.where(n_gold > 0, tp / n_gold.clamp(min=1), torch.zeros_like(tp))
    denom = precision + recall
    f1 = torch.where(
        denom > 0,
        2 * precision * recall / torch.where(denom > 0, denom, torch.ones_like(denom)),
        torch.zeros_like(denom),
    )
    return precision, recall, f1


def _spans(tokens: Tensor) -> Tuple[Tensor, Tensor]:
    """Run ids ``[B, T]`` (−1 outside runs) and the number of runs per row of a bool ``[B, T]``."""
    starts = tokens.clone()
    starts[:, 1:] &= ~tokens[:, :-1]
    run = torch.cumsum(starts.long(), 1) - 1
    return torch.where(tokens, run, torch.full_like(run, -1)), starts.sum(1)


def span_match_counts(pred: Tensor, gold: Tensor, iou_threshold: float = 0.5) -> Tuple[Tensor, Tensor, Tensor]:
    """Per instance: (predicted spans whose best IOU with a gold span is ≥ ``iou_threshold``, #predicted spans,
    #gold spans). Spans are maximal runs of contiguous True tokens (ERASER's ``partial_match_score``)."""
    B, T = pred.shape
    pid, n_pred = _spans(pred)
    gid, n_gold = _spans(gold)
    S = max(int(n_pred.max()) if B else 0, 1)
    G = max(int(n_gold.max()) if B else 0, 1)
    one_p = torch.zeros(B, T, S + 1, device=pred.device, dtype=torch.float64)
    one_p.scatter_(2, (pid + 1).clamp(min=0).unsqueeze(2), 1.0)
    one_g = torch.zeros(B, T, G + 1, device=pred.device, dtype=torch.float64)
    one_g.scatter_(2, (gid + 1).clamp(min=0).unsqueeze(2), 1.0)
    one_p, one_g = one_p[:, :, 1:], one_g[:, :, 1:]  # drop the "outside any span" column
    inter = torch.bmm(one_p.transpose(1, 2), one_g)  # [B, S, G]
    size_p, size_g = one_p.sum(1), one_g.sum(1)
    union = size_p.unsqueeze(2) + size_g.unsqueeze(1) - inter
    iou = torch.where(union > 0, inter / union.clamp(min=1), torch.zeros_like(inter))
    best = iou.amax(2) if G else torch.zeros(B, S, dtype=torch.float64, device=pred.device)
    real_span = torch.arange(S, device=pred.device).unsqueeze(0) < n_pred.unsqueeze(1)
    matched = ((best >= iou_threshold) & real_span).sum(1)
    return matched, n_pred, n_gold


def iou_f1(
    scores: Tensor,
    rationale: Tensor,
    mask: Tensor,
    *,
    k: Optional[Union[int, float]] = None,
    threshold: Optional[float] = None,
    iou_threshold: float = 0.5,
) -> Tensor:
    """Per-instance IOU F1 (ERASER): a predicted span counts as a match when its IOU with some gold span is ≥ 0.5.

    Predicted spans are the contiguous runs of the binarised map (:func:`binarize`), gold spans the runs of the
    rationale. Per instance P = matches / #predicted spans, R = matches / #gold spans (0 when a count is 0),
    F1 = 2PR/(P+R) (0 when P + R = 0). :class:`~lightning_xai.metrics.IOUF1` accumulates ERASER's micro
    average (summed counts) instead.

    Example:
        >>> import torch
        >>> iou_f1(torch.tensor([[0.9, 0.8, 0.0, 0.7]]), torch.tensor([[True, True, True, False]]),
        ...        torch.ones(1, 4, dtype=torch.bool), threshold=0.5)
        tensor([0.6667], dtype=torch.float64)
    """
    check_maps(scores, mask=mask, names=("scores",))
    _check_rationale(rationale, mask)
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must lie in (0, 1], got {iou_threshold}.")
    pred = binarize(scores, mask, rationale, k=k, threshold=threshold)
    matched, n_pred, n_gold = span_match_counts(pred, rationale & mask, iou_threshold)
    matched = matched.double()
    precision = torch.where(n_pred > 0, matched / n_pred.clamp(min=1), torch.zeros_like(matched))
    recall = torch.where(n_gold > 0, matched / n_gold.clamp(min=1), torch.zeros_like(matched))
    denom = precision + recall
    return torch.where(
        denom > 0,
        2 * precision * recall / torch.where(denom > 0, denom, torch.ones_like(denom)),
        torch.zeros_like(denom),
    )


def auprc(scores: Tensor, rationale: Tensor, mask: Tensor) -> Tensor:
    """Per-instance area under the precision-recall curve of ``scores`` ranking the rationale tokens.

    Equal to ``sklearn.metrics.average_precision_score(rationale[b][mask[b]], scores[b][mask[b]])``:
    AP = Σ_n (R_n − R_{n−1}) P_n over the distinct score thresholds (tied scores form one threshold). An
    instance without any rationale token has no precision-recall curve: NaN (sklearn returns 0 with a warning;
    ERASER drops such instances); the Metric class skips it.

    Example:
        >>> import torch
        >>> auprc(torch.tensor([[0.1, 0.4, 0.35, 0.8]]), torch.tensor([[False, False, True, True]]),
        ...       torch.ones(1, 4, dtype=torch.bool))
        tensor([0.8333], dtype=torch.float64)
    """
    check_maps(scores, mask=mask, names=("scores",))
    check_mask(mask, tuple(scores.shape))
    _check_rationale(rationale, mask)
    B, T = scores.shape
    filled = scores.double().masked_fill(~mask, float("-inf"))
    ordered, order = torch.sort(filled, dim=1, descending=True, stable=True)
    real = torch.isfinite(ordered)
    gold = (rationale & mask).gather(1, order).double()
    tps = torch.cumsum(gold, 1)
    seen = torch.arange(1, T + 1, device=scores.device, dtype=torch.float64).unsqueeze(0)
    # the last position of each group of equal scores is a threshold
    last = torch.ones_like(real)
    last[:, :-1] = ordered[:, :-1] != ordered[:, 1:]
    last &= real
    positives = gold.sum(1, keepdim=True)
    precision = tps / seen
    recall = tps / positives.clamp(min=1)
    # recall increments between consecutive thresholds
    prev_recall = torch.zeros_like(recall)
    thr_recall = torch.where(last, recall, torch.zeros_like(recall))
    # carry the recall at the previous threshold forward
    running = torch.cummax(thr_recall, dim=1).values
    prev_recall[:, 1:] = running[:, :-1]
    ap = ((recall - prev_recall) * precision * last.double()).sum(1)
    return torch.where(positives.squeeze(1) > 0, ap, torch.full_like(ap, float("nan")))


def impermissible_mass(
    attention: Tensor, impermissible: Tensor, token_mask: Optional[Tensor] = None, *, check: bool = True
) -> Tensor:
    """Σ_{i∈I} α_i over the last dimension: the attention mass on a marked token set ``I`` (Pruthi et al.'s
    impermissible tokens, or a rationale). ``attention`` ``[..., T]``, ``impermissible`` bool ``[B, T]``.

    ``attention`` may carry extra middle dimensions (e.g. ``[B, heads, T]``); the mask broadcasts over them. The one
    implementation behind the deception penalty, the impermissible-attention monitor and ``HFClassifier``'s log.
    The attention is always checked to be a distribution, so that a model returning unnormalised weights gets a
    clear error instead of a mass above 1: with ``token_mask`` (``[B, T]`` real tokens) a ``[B, T]`` attention over
    the real tokens (:func:`~lightning_xai.adapters.checks.check_attention_distribution`), otherwise over the last
    dimension (:func:`~lightning_xai.metrics.functional._validation.check_distributions`). ``impermissible`` must
    be bool, or hold only 0 and 1 (an int mask holding 2 would count a token twice). ``check=False`` skips the
    value checks (not the shapes): for the deception penalty, which runs every training step and guards
    non-finite attention itself.

    Example:
        >>> impermissible_mass(torch.tensor([[0.2, 0.3, 0.5]]), torch.tensor([[True, False, True]]))
        tensor([0.7000])
        >>> impermissible_mass(torch.tensor([[1.0, 1.5, 2.5]]), torch.tensor([[True, False, True]]),
        ...                    token_mask=torch.ones(1, 3, dtype=torch.bool))
        Traceback (most recent call last):
        ...
        ValueError: ExplainOutput.attention is not a distribution over the real tokens: row 0 sums to 5 over its real tokens (expected 1 within 0.001). The protocol's attention is softmax(scores) over the real tokens (token_mask), 0 elsewhere: return the normalised weights the model pools with (unnormalised scores go in attention_scores), renormalised over the real tokens if the model also attends to special tokens.
    """
    if (
        not isinstance(impermissible, Tensor)
        or impermissible.dim() != 2
        or attention.dim() < 2
        or (impermissible.shape[0], impermissible.shape[-1]) != (attention.shape[0], attention.shape[-1])
    ):
        raise ValueError(
            f"impermissible must be a [B, T] mask over the attention's [B, ..., T] = "
            f"{tuple(getattr(attention, 'shape', ()))}, got "
            f"{tuple(impermissible.shape) if isinstance(impermissible, Tensor) else type(impermissible)}."
        )
    if check and impermissible.dtype != torch.bool:
        rows = ((impermissible != 0) & (impermissible != 1)).any(-1).nonzero().flatten()
        if rows.numel():
            raise ValueError(
                f"impermissible holds values other than 0 and 1 in rows {rows.tolist()[:10]}; it is a "
                "mask of tokens (a value of 2 would count a token twice): pass impermissible.bool()."
            )
    if check and token_mask is not None and attention.dim() == 2:
        check_attention_distribution(attention, token_mask)
    elif check:
        check_distributions(attention, names=("attention",))
    mask = impermissible.to(device=attention.device, dtype=torch.bool).to(attention.dtype)
    while mask.dim() < attention.dim():
        mask = mask.unsqueeze(1)
    return (attention * mask).sum(-1)

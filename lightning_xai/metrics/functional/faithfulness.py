"""ERASER faithfulness (DeYoung et al., 2020) of a token score map, per instance, by deleting tokens.

With ŷ the predicted class on the full input x (or a given ``target``) and r the top-k tokens of the score map:

* comprehensiveness = p(ŷ | x) − p(ŷ | x ∖ r): deleting the rationale should hurt (higher is better);
* sufficiency = p(ŷ | x) − p(ŷ | r): the rationale alone should keep the prediction (lower is better);
* AOPC: each averaged over the top-k bins {1, 5, 10, 20, 50}% of the real tokens.

p is the model's probability under its head (a sigmoid's for a multi-label model); with ``output="logit"`` the logit.
A regression model has no probability (asked for explicitly, it is refused by name): by default p is its output
value, and comprehensiveness is the change of that value (:func:`~lightning_xai.attribution.targets.score_values`).

Tokens are *deleted* (the sequence gets shorter, masks stay aligned; see
:func:`lightning_xai.attribution.batching.erase_tokens`), never replaced. Conventions:

* |r| = clamp(ceil(k · n), 1, n) for a fraction ``k`` (n = real tokens), min(k, n) for an int ``k``; ties in the
  score map are broken by position (earlier first). Special tokens (``<sos>``/``<eos>``, ``[CLS]``) are never
  in r and never deleted.
* x ∖ r keeps at least one real token: at most n − 1 tokens are deleted, the lowest-scored one is kept. An
  instance with a single real token therefore has comprehensiveness 0, and sufficiency 0 (r = x).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.protocol import Batch, ExplainableModel, as_explainable
from lightning_xai.attribution import explanation_context, resolve_target
from lightning_xai.attribution.targets import target_score
from lightning_xai.metrics.functional._validation import check_maps, resolve_k, topk_mask
from lightning_xai.metrics.functional.erasure import erasure_probabilities

__all__ = ["AOPC_BINS", "aopc", "comprehensiveness", "erasure_scores", "rationale_mask", "sufficiency"]

#: ERASER's AOPC bins: fractions of the real tokens.
AOPC_BINS: Tuple[float, ...] = (0.01, 0.05, 0.1, 0.2, 0.5)


def rationale_mask(scores: Tensor, mask: Tensor, k: Union[int, float]) -> Tensor:
    """``[B, T]`` bool: the top-k real tokens of ``scores`` (k an int, or a fraction in (0, 1], ≥ 1 token).

    Example:
        >>> import torch
        >>> rationale_mask(torch.tensor([[0.1, 0.9, 0.5, 0.7]]), torch.ones(1, 4, dtype=torch.bool), 0.5)
        tensor([[False,  True, False,  True]])
    """
    check_maps(scores, mask=mask, names=("scores",))
    return topk_mask(scores, mask, resolve_k(k, mask.sum(1)))


def _removals(scores: Tensor, mask: Tensor, k: Union[int, float]) -> Tuple[Tensor, Tensor]:
    """(tokens deleted for comprehensiveness, tokens deleted for sufficiency) for one k."""
    n = mask.sum(1)
    size = resolve_k(k, n)
    r = topk_mask(scores, mask, size)
    comp = topk_mask(scores, mask, torch.minimum(size, n - 1))  # keep at least one token
    suff = mask & ~r
    return comp, suff


def erasure_scores(
    model: ExplainableModel,
    batch: Batch,
    scores: Tensor,
    ks: Sequence[Union[int, float]],
    target: Any = None,
    *,
    max_rows: int = 1024,
    logits: Optional[Tensor] = None,
    output: Optional[str] = None,
) -> Tuple[Tensor, Tensor]:
    """Comprehensiveness and sufficiency for each k of ``ks``: two ``[len(ks), B]`` tensors.

    ``scores`` is one ``[B, T]`` map or a stack of ``R`` maps ``[R, B, T]`` (then both results are
    ``[R, len(ks), B]``): the maps of a stack share the full pass and the batched passes over their erasures, and an
    erasure two maps (or two sizes) agree on is scored once. One full forward pass plus at most ``2·len(ks)·B``
    erased rows per map, scored in batched passes of ``max_rows`` rows. The model is put in eval mode while this
    runs (modes restored); no gradients are built. ``logits``: the model's ``[B, C]`` logits on ``batch`` from an
    eval-mode pass already made under the same precision (e.g. :func:`decision_flip`'s): the full pass is skipped.
    ``output``: the score whose change is measured, under the model's head
    (:func:`~lightning_xai.attribution.targets.score_values`): ``"probability"`` (a sigmoid's for a multi-label
    model) or ``"logit"``; ``None`` (default) is the probability, and for a regression model the change of its output
    value, value(x) − value(x ∖ r) (its probability, asked for explicitly, is refused by name).

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> maps = torch.tensor([[[0.1, 0.9, 0.2, 0.3]], [[0.4, 0.3, 0.2, 0.1]]])  # two maps of the one row
        >>> comp, suff = erasure_scores(model, batch, maps, [1, 0.5])
        >>> comp.shape, suff.shape
        (torch.Size([2, 2, 1]), torch.Size([2, 2, 1]))
    """
    model = as_explainable(model)
    if len(ks) == 0:
        raise ValueError("ks is empty; give at least one top-k size (int) or fraction in (0, 1].")
    stacked = isinstance(scores, Tensor) and scores.dim() == 3
    maps = list(scores.unbind(0)) if stacked else [scores]
    if not maps:
        raise ValueError("scores is an empty stack of maps; give at least one [B, T] map.")
    with explanation_context(model, batch) as safe, torch.no_grad():
        mask = model.token_mask(safe)
        for i, one in enumerate(maps):
            check_maps(one, mask=mask.to(one.device), names=(f"scores[{i}]" if stacked else "scores",))
        if logits is None:
            logits = model.forward_from_embeddings(model.embed(safe), safe).logits
        elif logits.shape[0] != mask.shape[0]:
            raise ValueError(f"logits has {logits.shape[0]} rows; the batch has {mask.shape[0]}.")
        logits = logits.detach().to(mask.device)
        tgt = resolve_target(logits, target)
        full = target_score(logits, tgt, output, head_kind_of(model))
        removals = []
        for one in maps:
            one = one.detach().to(mask.device)
            for k in ks:
                comp, suff = _removals(one, mask, k)
                removals += [comp, suff]
        probs = erasure_probabilities(model, safe, removals, tgt, max_rows=max_rows, output=output)
        # nothing deleted (one-token instance, or r = x): the input is x itself, the difference is exactly 0
        unchanged = torch.stack([~r.any(1) for r in removals])
        probs = torch.where(unchanged, full.unsqueeze(0).expand_as(probs), probs)
    probs = probs.view(len(maps), len(ks), 2, -1)
    comp_scores, suff_scores = full - probs[:, :, 0], full - probs[:, :, 1]
    return (comp_scores, suff_scores) if stacked else (comp_scores[0], suff_scores[0])


def comprehensiveness(
    model: ExplainableModel,
    batch: Batch,
    scores: Tensor,
    k: Union[int, float] = 0.2,
    target: Any = None,
    *,
    output: Optional[str] = None,
) -> Tensor:
    r"""``[B]`` ERASER comprehensiveness p(ŷ | x) − p(ŷ | x ∖ r), r = the top-k tokens of ``scores``.

    Args:
        model: an :class:`~lightning_xai.adapters.ExplainableModel`.
        batch: the batch the map explains.
        scores: ``[B, T]`` token scores (higher = more important); pads are ignored.
        k: rationale size: an int number of tokens or a fraction in (0, 1] of each instance's real tokens.
        target: class whose probability is measured (default: the predicted class on the full input).
        output: ``"probability"``, ``"logit"`` or ``None`` (the probability; a regression model's output value); see
            :func:`erasure_scores`.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> comprehensiveness(model, batch, torch.tensor([[0.1, 0.9, 0.2, 0.3]]), k=1).shape
        torch.Size([1])
    """
    return erasure_scores(model, batch, scores, [k], target, output=output)[0][0]


def sufficiency(
    model: ExplainableModel,
    batch: Batch,
    scores: Tensor,
    k: Union[int, float] = 0.2,
    target: Any = None,
    *,
    output: Optional[str] = None,
) -> Tensor:
    r"""``[B]`` ERASER sufficiency p(ŷ | x) − p(ŷ | r), r = the top-k tokens of ``scores`` (see
    :func:`comprehensiveness` for the arguments).

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> float(sufficiency(model, batch, torch.tensor([[0.1, 0.9, 0.2, 0.3]]), k=1.0)[0])
        0.0
    """
    return erasure_scores(model, batch, scores, [k], target, output=output)[1][0]


def aopc(
    model: ExplainableModel,
    batch: Batch,
    scores: Tensor,
    bins: Sequence[Union[int, float]] = AOPC_BINS,
    target: Any = None,
    *,
    output: Optional[str] = None,
) -> Tuple[Tensor, Tensor]:
    r"""``([B], [B])``: AOPC comprehensiveness and AOPC sufficiency — each the mean over ``bins`` of the
    per-bin value (ERASER's definition; bins default to {1, 5, 10, 20, 50}% of the real tokens).

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> comp, suff = aopc(model, batch, torch.tensor([[0.1, 0.9, 0.2, 0.3]]))
        >>> comp.shape, suff.shape
        (torch.Size([1]), torch.Size([1]))
    """
    comp, suff = erasure_scores(model, batch, scores, list(bins), target, output=output)
    return comp.mean(0), suff.mean(0)

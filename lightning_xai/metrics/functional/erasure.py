"""Erasure measurements: score many token erasures of a batch, and the rankings of Serrano & Smith's (2019) decision
flip (:mod:`~lightning_xai.metrics.functional.decision_flips`).

* :func:`erasure_probabilities` scores many erasures of one batch (tokens deleted with
  :func:`~lightning_xai.attribution.batching.erase_tokens`) in a few batched forward passes; ERASER's
  comprehensiveness and sufficiency (:mod:`~lightning_xai.metrics.functional.faithfulness`) are built on it.
* :func:`attention_gradient` and :func:`ranking_scores` give the rankings Serrano & Smith compare: attention,
  random, the gradient of the decision w.r.t. attention, and gradient × attention.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.protocol import Batch, ExplainableModel, as_explainable
from lightning_xai.attribution import batching, explanation_context, gather_rows, resolve_target
from lightning_xai.attribution.batching import (
    _check_remove,
    _trim_padding,
    batch_shape,
    erase_tokens,
    length_chunks,
    padding_trimmer,
    row_extents,
)
from lightning_xai.attribution.heads import default_output
from lightning_xai.attribution.override_replay import override_scorer
from lightning_xai.attribution.targets import score_values, target_score

__all__ = [
    "RANKINGS",
    "attention_gradient",
    "erasure_probabilities",
    "ranking_scores",
]

#: Rankings :func:`ranking_scores` computes by name (Serrano & Smith's four).
RANKINGS = ("attention", "random", "gradient", "grad_x_attention")


def erasure_probabilities(
    model: ExplainableModel,
    batch: Batch,
    removals: Sequence[Tensor],
    target: Tensor,
    *,
    max_rows: int = 1024,
    max_tokens: Optional[int] = None,
    output: Optional[str] = None,
) -> Tensor:
    """``[K, B]``: probability of ``target`` after each of the ``K`` erasures in ``removals`` (``[B, T]`` bools).

    The probability under the model's head (:func:`~lightning_xai.attribution.targets.score_values`: a sigmoid's
    for a multi-label model); ``output="logit"`` scores the logit instead. ``output=None`` is the head's default
    (:func:`~lightning_xai.attribution.heads.default_output`): the output value of a regression model, whose
    probability is refused by name.

    The ``K·B`` erased rows are built in one batch (rows repeated, then tokens deleted; an erasure that repeats
    another of the same row — two sizes that round to one rationale, two rankings that agree — is built and scored
    once), sorted by length and
    scored in forward passes of at most ``max_rows`` rows and ``max_tokens`` padded tokens (default: ``max_rows``
    rows at the erased batch's width, and on CPU at most
    :data:`~lightning_xai.attribution.batching.CPU_PASS_TOKENS`), each pass trimmed to its longest row
    (:func:`~lightning_xai.attribution.batching.length_chunks`): a sufficiency row that keeps 10% of its tokens
    runs at its own width, not the batch's. The probabilities do not depend on the batching (up to float
    rounding). Runs without gradients; call it inside :func:`~lightning_xai.attribution.explanation_context`
    (as the metrics do) for eval mode.
    """
    for name, value in (("max_rows", max_rows), ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}.")
    model = as_explainable(model)
    head = head_kind_of(model)
    output = default_output(model) if output is None else output
    score_values(torch.zeros(1, 1), output, head)  # refused before any pass: a probability of a regression head
    mask = model.token_mask(batch)
    B = mask.shape[0]
    if not removals:
        return torch.empty(0, B, device=mask.device)
    for i, remove in enumerate(removals):
        _check_remove(remove, mask, name=f"removals[{i}]")
    K = len(removals)
    flat = torch.cat([r.to(mask.device) for r in removals], 0)  # variant k of row b is row k·B + b
    # the same deletion of the same row (two k that round to one rationale size, two rankings that agree on it)
    # is scored once
    source = torch.arange(B, device=mask.device).repeat(K)
    keys = torch.cat([source.view(-1, 1), flat.long()], 1)
    unique, inverse = torch.unique(keys, dim=0, return_inverse=True)
    K_unique = unique.shape[0]
    rows_of = unique[:, 0]
    erased = erase_tokens(model, gather_rows(batch, rows_of, B), unique[:, 1:].bool())
    width = batch_shape(model, erased)[1]
    targets = target.to(mask.device).index_select(0, rows_of)
    budget = max_tokens
    if budget is None:
        budget = max_rows * max(width, 1)
        budget = min(budget, batching.CPU_PASS_TOKENS) if mask.device.type == "cpu" else budget
    parts = []
    with torch.no_grad():
        trim = padding_trimmer(model, batch, B)  # the identity for a model that reads its padding
        lengths = row_extents(erased, K_unique) if trim is _trim_padding else torch.full((K_unique,), width)
        for idx in length_chunks(lengths, budget, max_rows=max_rows):
            idx = idx.to(mask.device)
            part = trim(gather_rows(erased, idx, K_unique), (idx.numel(), width))
            logits = model.forward_from_embeddings(model.embed(part), part).logits
            parts.append((idx, target_score(logits, targets[idx], output, head)))
    order = torch.cat([idx for idx, _ in parts])
    probs = torch.cat([values for _, values in parts])
    return torch.empty_like(probs).index_copy(0, order, probs).index_select(0, inverse).view(K, B)


def attention_gradient(model: ExplainableModel, batch: Batch, target: Any = None) -> Tensor:
    """``[B, T]`` gradient of the target logit (default: the predicted class) w.r.t. the attention weights α.

    α is the model's own attention, fed back through ``attention_override=α.requires_grad_()`` with the
    embeddings detached, so only the path through the attention weights is differentiated (Serrano & Smith's
    "gradient" ranking). Zero at positions that are not real tokens. Restores the model's modes. Where the model
    offers a checked override scorer (:func:`~lightning_xai.attribution.override_replay.override_scorer`) the
    gradient flows through it only — the last layer and the head of a transformer — the same gradient, cheaper.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> attention_gradient(model, batch).shape
        torch.Size([2, 3])
    """
    model = as_explainable(model)
    with explanation_context(model, batch) as safe:
        emb = model.embed(safe).detach()
        with torch.no_grad():
            out, scorer = override_scorer(model, emb, safe)
        return _attention_gradient(model, safe, emb, out, scorer, resolve_target(out.logits, target))


def ranking_scores(
    model: ExplainableModel,
    batch: Batch,
    ranking: Union[str, Tensor] = "attention",
    *,
    generator: Optional[torch.Generator] = None,
    target: Any = None,
) -> Tensor:
    """``[B, T]`` scores whose descending order ranks the attention items to erase.

    Args:
        model: the explainable model.
        batch: the batch.
        ranking: ``"attention"`` (α), ``"random"`` (uniform noise from ``generator``), ``"gradient"``
            (∂ logit / ∂α, signed: the items whose weight raises the decision most come first) or
            ``"grad_x_attention"`` (α · ∂ logit / ∂α); or a ``[B, T]`` score map of your own (e.g. a saliency map).
        generator: random source for ``"random"`` (seed it for reproducible rankings).
        target: class whose logit the gradient rankings use (default: the predicted class).

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> ranking_scores(model, batch, "random", generator=torch.Generator().manual_seed(0)).shape
        torch.Size([1, 3])
    """
    model = as_explainable(model)
    mask = model.token_mask(batch)
    if isinstance(ranking, Tensor):
        if ranking.shape != mask.shape:
            raise ValueError(
                f"ranking scores have shape {tuple(ranking.shape)}; expected the token mask's {tuple(mask.shape)}."
            )
        bad = (~torch.isfinite(ranking.detach()) & mask.to(ranking.device)).any(1).nonzero().flatten()
        if bad.numel():
            raise ValueError(f"ranking scores have NaN or inf at real tokens of rows {bad.tolist()[:10]}.")
        return ranking.detach()
    if ranking not in RANKINGS:
        raise ValueError(f"Unknown ranking {ranking!r}; choose one of {list(RANKINGS)} or pass a [B, T] score map.")
    if ranking == "random":
        noise = torch.rand(mask.shape, generator=generator, device="cpu" if generator is None else generator.device)
        return noise.to(mask.device).masked_fill(~mask, 0.0)
    if ranking == "attention":
        with explanation_context(model, batch) as safe, torch.no_grad():
            return model.forward_from_embeddings(model.embed(safe), safe).attention.detach()
    grad = attention_gradient(model, batch, target=target)
    if ranking == "gradient":
        return grad
    with explanation_context(model, batch) as safe, torch.no_grad():
        alpha = model.forward_from_embeddings(model.embed(safe), safe).attention.detach()
    return grad * alpha


def _attention_gradient(
    model: ExplainableModel, batch: Batch, embeddings: Tensor, out: Any, scorer: Any, target: Tensor
) -> Tensor:
    """The gradient of :func:`attention_gradient` from a pass over ``batch`` already made (``out``), through the
    override scorer when there is one (α acts only where it starts), else through a full pass. Grad mode on."""
    mask = model.token_mask(batch)
    with torch.enable_grad():
        alpha = out.attention.detach().clone().requires_grad_(True)
        if scorer is not None:
            logits = scorer(torch.arange(mask.shape[0], device=mask.device), alpha)
        else:
            logits = model.forward_from_embeddings(embeddings, batch, attention_override=alpha).logits
        (grad,) = torch.autograd.grad(logits.gather(1, target.view(-1, 1)).sum(), alpha)
    return grad.detach().masked_fill(~mask, 0.0)

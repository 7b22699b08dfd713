"""Serrano & Smith's (2019) decision flip: zero attention weights one ranked item at a time — with the encoder
outputs fixed, through ``attention_override`` (or an override scorer that replays the layers before the override) —
renormalise, and record when the decision first changes (the functional twin of
:class:`~lightning_xai.metrics.DecisionFlip`). The rankings come from :mod:`~lightning_xai.metrics.functional.erasure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union, cast

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import OverrideScorer, head_kind_of, packs_overrides
from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput, as_explainable
from lightning_xai.adapters.sharding import agree
from lightning_xai.attribution import explanation_context, gather_rows
from lightning_xai.attribution.batching import (
    _trim_padding,
    padding_trimmer,
)
from lightning_xai.attribution.heads import decisions
from lightning_xai.attribution.override_replay import override_scorer
from lightning_xai.attribution.targets import warn_nonfinite_logits
from lightning_xai.metrics.functional.erasure import _attention_gradient, ranking_scores

__all__ = ["PACKED_CALL_ELEMENTS", "DecisionFlipResult", "decision_flip"]

#: elements of one call's ``[rows, T]`` override tensors for a scorer that packs a row's overrides: it sizes its own
#: passes (its memory budget), so a call takes up to this many (16 MiB of float32 each), at least ``max_rows`` rows
PACKED_CALL_ELEMENTS = 1 << 22

#: rankings decision_flip takes from its own pass over the batch (the others are drawn or given)
_FROM_THE_PASS = ("attention", "gradient", "grad_x_attention")


@dataclass
class DecisionFlipResult:
    """Per-instance outcome of :func:`decision_flip` (all ``[B]``, ``[R, B]`` for a stack of ``R`` rankings; −1
    where the decision never flips; a row whose logits are NaN or inf has no decision: its ``attention_removed``
    and ``fraction_removed`` are NaN, ``items_removed`` −1 and ``flipped`` False, with a ``RuntimeWarning``).

    Attributes:
        items_removed: attention items zeroed when the argmax first changed (LongTensor), or −1.
        attention_removed: attention mass (sum of the original α of those items), or −1.
        fraction_removed: ``items_removed / n`` (n = real tokens of the instance), or −1.
        flipped: whether the decision flipped before only one item was left.
        lengths: n, the real tokens of each instance.
        scores: the score map(s) that ranked the items (``[B, T]``, ``[R, B, T]`` for a stack).
        logits: ``[B, C]`` the model's logits on the full batch (the pass the flips start from).
    """

    items_removed: Tensor
    attention_removed: Tensor
    fraction_removed: Tensor
    flipped: Tensor
    lengths: Tensor
    scores: Optional[Tensor] = None
    logits: Optional[Tensor] = None


def decision_flip(
    model: ExplainableModel,
    batch: Batch,
    ranking: Union[str, Tensor, Sequence[Union[str, Tensor]]] = "attention",
    *,
    generator: Optional[torch.Generator] = None,
    max_rows: int = 2048,
    replay: Optional[Tuple[ExplainOutput, Optional[OverrideScorer]]] = None,
) -> DecisionFlipResult:
    """Serrano & Smith's erasure test: zero attention items in ranked order until the decision flips.

    With the encoder outputs fixed (the model is re-run from the same embeddings with ``attention_override``),
    step s zeroes the s highest-ranked real tokens' attention weights and renormalises the rest to sum to 1
    (uniform over the remaining tokens if their weights are all exactly 0). Steps run from 1 to n − 1, so at least
    one item is always left; if the decision never changes the instance records −1. Ranking ties are broken by
    position (earlier first). The decision is the argmax class; for a multi-label (sigmoid) model the set of labels
    with probability above 0.5 (a flip: any label crosses 0.5), the gradient rankings then using the top label's
    logit; a regression model makes no decision and is refused by name
    (:func:`~lightning_xai.attribution.heads.decisions`).

    All steps of all instances are built as one stack of ``Σ (n_b − 1)`` overridden attention rows and run in
    forward passes of at most ``max_rows`` rows, lowest steps first, each pass reaching twice as many steps as the
    one before (step 1, then 2–3, 4–7, …); instances that already flipped are dropped from later passes, so an
    instance that flips early costs few rows and the passes stay few (about log₂ of the longest instance). A
    scorer that packs the overrides of a row into one sequence
    (:func:`~lightning_xai.adapters.capabilities.packs_overrides`: the row once, one position per step) gets every
    step of an instance in the same pass instead, instance after instance, in calls of up to
    :data:`PACKED_CALL_ELEMENTS` override elements (at least ``max_rows`` rows), whose passes it sizes itself: spread
    over the doubling passes, the row itself would be recomputed in each of them (about log₂ n times), which costs
    more than the steps an early flip would have saved.
    Where the model offers a checked replay of its overrides
    (:func:`~lightning_xai.attribution.override_replay.override_scorer`: an
    :class:`~lightning_xai.adapters.capabilities.OverrideReplay` or
    :class:`~lightning_xai.adapters.capabilities.LinearHead` model) a pass runs only what the override changes
    (the last layer and the head of a transformer, the pooling and the head of the reference BiLSTM); otherwise the
    model is re-run from the embeddings, each pass as wide as its longest row.

    Args:
        model: the explainable model (put in eval mode while this runs; modes are restored).
        batch: the batch.
        ranking: ``"attention"``, ``"random"``, ``"gradient"``, ``"grad_x_attention"`` or a ``[B, T]`` score map
            (see :func:`ranking_scores`); the highest score is erased first. A stack of ``R`` maps ``[R, B, T]``,
            or a list of ``R`` names and maps, ranks every row once per ranking, sharing the model's full pass, its
            replay and the batched passes (every field of the result is then ``[R, B]``); the gradient rankings
            are back-propagated through the replay only (the last layer and the head of a transformer).
        generator: random source for ``ranking="random"``.
        max_rows: rows per forward pass (per call of a packing scorer: at least this many).
        replay: ``override_scorer(model, model.embed(batch), batch)`` if already made for this batch (in eval mode,
            under the same precision): its pass and checked scorer are used instead of making them again.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> result = decision_flip(model, batch, "attention")
        >>> bool(result.items_removed[0] == -1 or 1 <= result.items_removed[0] <= 3)
        True
    """
    if not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive int, got {max_rows!r}.")
    model = as_explainable(model)
    head = head_kind_of(model)
    decisions(torch.zeros(1, 1), head)  # a regression head makes no decision: refused by name before any pass
    listed = isinstance(ranking, (list, tuple))
    stacked = listed or (isinstance(ranking, Tensor) and ranking.dim() == 3)
    entries: List[Union[str, Tensor]] = (
        list(ranking)
        if isinstance(ranking, (list, tuple))
        else list(ranking.unbind(0))
        if isinstance(ranking, Tensor) and stacked
        else [cast(Union[str, Tensor], ranking)]
    )  # not a list or tuple: one name or map (else ranking_scores rejects it)
    if not entries:
        raise ValueError("ranking is an empty stack of rankings; give at least one name or [B, T] map.")
    # score maps and random draws are checked before the pass; the model's own rankings come from its pass below
    given: List[Union[str, Tensor]] = [
        one
        if isinstance(one, str) and one in _FROM_THE_PASS
        else ranking_scores(model, batch, one, generator=generator)
        for one in entries
    ]
    with explanation_context(model, batch) as safe, torch.no_grad():
        mask = model.token_mask(safe)
        if bool((~mask.any(1)).any()):
            raise ValueError("decision_flip: some rows have no real token; drop empty examples first.")
        B, T = mask.shape
        device = mask.device
        emb = model.embed(safe)
        out, scorer = replay if replay is not None else override_scorer(model, emb, safe)
        decision = decisions(out.logits, head)  # the argmax class; a multi-label model's set of labels
        # rows with NaN/inf logits have no decision to flip: warned here, their results are NaN (below)
        defined = None if warn_nonfinite_logits(out.logits) else torch.isfinite(out.logits.detach()).all(-1)
        alpha = out.attention.detach().masked_fill(~mask, 0.0)
        grad = None
        if any(isinstance(one, str) and one in ("gradient", "grad_x_attention") for one in entries):
            grad = _attention_gradient(model, safe, emb, out, scorer, out.logits.detach().argmax(-1))
        named = {"attention": alpha}
        if grad is not None:
            named.update(gradient=grad, grad_x_attention=grad * alpha)
        scores = torch.stack([named[one] if isinstance(one, str) else one.to(device).to(alpha.dtype) for one in given])
        R = scores.shape[0]
        # R·B instances, ranking-major: instance r·B + b is row b of the batch ranked by map r
        source = torch.arange(B, device=device).repeat(R)
        ranked = scores.reshape(R * B, T)
        alpha, mask = alpha.repeat(R, 1), mask.repeat(R, 1)
        decision = decision.repeat(R, *([1] * (decision.dim() - 1)))
        lengths = mask.sum(1)
        ranked = ranked.masked_fill(~mask, float("-inf"))
        order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
        N = R * B
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(T, device=device).expand(N, T).contiguous())
        mass_in_order = torch.cumsum(alpha.gather(1, order), dim=1)  # mass of the first s items at index s − 1

        steps = (lengths - 1).clamp(min=0)
        max_step = int(steps.max()) if N else 0
        # (i, s) for s = 1..n_i − 1, ordered by step, then instance; a scorer that packs the overrides of a row
        # lays the row out once per call: every step of an instance then goes in the same pass (instance, then step)
        packs = packs_overrides(scorer)
        step_grid = torch.arange(1, max_step + 1, device=device).view(-1, 1).expand(max_step, N)
        inst_grid = torch.arange(N, device=device).view(1, -1).expand(max_step, N)
        if packs:
            step_grid, inst_grid = step_grid.t(), inst_grid.t()
        valid = step_grid <= steps.view(-1, 1) if packs else step_grid <= steps.view(1, -1)
        row_inst, row_step = inst_grid[valid], step_grid[valid]

        first_flip = torch.full((N,), T + 1, dtype=torch.long, device=device)
        trim = padding_trimmer(model, safe, B) if scorer is None else _trim_padding
        # a pass scores steps up to the horizon: 1, then 2-3, 4-7, 8-15, ...; every step at once for a packing scorer
        pointer, horizon = 0, max_step if packs else 1
        # rows per call: a packing scorer lays out each call's rows in as few passes as its budget allows, and each
        # call costs a fixed overhead per pass (measured: 5 calls of 2,048 rows → 1 on the LoRA Llama, −10 %)
        per_call = max(max_rows, PACKED_CALL_ELEMENTS // max(T, 1)) if packs else max_rows
        while pointer < row_inst.numel():
            pending_inst, pending_step = row_inst[pointer:], row_step[pointer:]
            alive = first_flip[pending_inst] > pending_step
            if not bool(alive.any()):
                break
            within = alive & (pending_step <= horizon)
            if not bool(within.any()):
                horizon = 2 * horizon + 1
                continue
            take = within.nonzero().flatten()[:per_call]
            inst, step = pending_inst[take], pending_step[take]
            pointer += int(take[-1]) + 1
            removed = rank[inst] < step.view(-1, 1)
            left = mask[inst] & ~removed
            weights = alpha[inst].masked_fill(~left, 0.0)
            total = weights.sum(1, keepdim=True)
            uniform = left.to(weights.dtype) / left.sum(1, keepdim=True).to(weights.dtype)
            override = torch.where(total > 0, weights / torch.where(total > 0, total, torch.ones_like(total)), uniform)
            rows = source[inst]
            if scorer is not None:
                logits = scorer(rows, override)
            else:  # full passes, as wide as the chunk's longest row
                part = trim(gather_rows(safe, rows, B), (rows.numel(), T))
                width = model.token_mask(part).shape[1]
                logits = model.forward_from_embeddings(
                    emb.index_select(0, rows)[:, :width], part, attention_override=override[:, :width]
                ).logits
            flips = decisions(logits, head) != decision[inst]
            flips = flips.any(-1) if flips.dim() == 2 else flips  # a multi-label decision: any label changed
            if bool(flips.any()):
                first_flip.scatter_reduce_(0, inst[flips], step[flips], reduce="amin")
            first_flip = agree(first_flip)  # a sharded model: every process scores the same rows next (lockstep)

        flipped = first_flip <= T
        items = torch.where(flipped, first_flip, torch.full_like(first_flip, -1))
        index = (first_flip - 1).clamp(min=0, max=max(T - 1, 0)).view(-1, 1)
        mass = torch.where(flipped, mass_in_order.gather(1, index).squeeze(1), torch.full_like(alpha[:, 0], -1.0))
        fraction = torch.where(
            flipped, first_flip.double() / lengths.double(), torch.full_like(first_flip, -1, dtype=torch.float64)
        )
        if defined is not None:
            undefined = ~defined.repeat(R)
            flipped, items = flipped & ~undefined, items.masked_fill(undefined, -1)
            mass, fraction = mass.masked_fill(undefined, float("nan")), fraction.masked_fill(undefined, float("nan"))
    shape = (R, B) if stacked else (B,)
    return DecisionFlipResult(
        items_removed=items.view(shape),
        attention_removed=mass.view(shape),
        fraction_removed=fraction.view(shape),
        flipped=flipped.view(shape),
        lengths=lengths.view(shape),
        scores=scores if stacked else scores[0],
        logits=out.logits.detach(),
    )

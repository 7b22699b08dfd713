"""Erasure on a text generator: ERASER's deletion metrics and a greedy-token flip, on the target's log-probability.

A generator (the :class:`~lightning_xai.adapters.capabilities.TargetSequence` capability) explains
``log p(target | source) = Σ_k log p(y_k | y_<k, source)``. Source (prompt) tokens are *deleted*
(:func:`~lightning_xai.attribution.batching.erase_tokens`: a causal LM's target moves left with its ``input_ids``, an
encoder–decoder's target stays), the target is kept and teacher-forced, and each erased row is re-run:

* **comprehensiveness** = ``log p(target | x) − log p(target | x ∖ r)``, r the top-k source tokens of a ranking;
  **sufficiency** = ``log p(target | x) − log p(target | r)`` (ERASER's conventions of
  :mod:`~lightning_xai.metrics.functional.faithfulness`: |r| = ceil(k·n) for a fraction, x ∖ r keeps at least one
  token); both also per target token (divided by the row's steps);
* **greedy-token flip** (Serrano & Smith's decision flip, per step): source tokens are deleted in ranking order, one
  more at a time, until the greedy (argmax) token of some explained step changes; the fraction of the source
  deleted then, and the attention mass it carried. ``steps_changed``: the share of the explained steps whose greedy
  token changes when the top-k tokens are deleted (the comprehensiveness erasure).

:func:`attention_row_gradient` gives the attention-gradient rankings of a generator: the gradient of the target's
log-probability w.r.t. the last layer's step rows (``extras["step_rows"]``, fed back as the override), summed over
steps and heads.
"""

from __future__ import annotations

from typing import Dict, Sequence, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution import explanation_context
from lightning_xai.attribution.batching import erase_tokens, gather_rows
from lightning_xai.audits.generation import StepScores, step_scores
from lightning_xai.metrics.functional.faithfulness import _removals

__all__ = ["attention_row_gradient", "erased_step_scores", "generation_erasure"]


def erased_step_scores(
    model: ExplainableModel, batch: Batch, rows: Tensor, removals: Tensor, base: StepScores, max_rows: int = 256
) -> StepScores:
    """``[N, K]`` step scores of rows ``rows`` of ``batch`` with the source tokens ``removals`` ``[N, T]`` deleted
    (a row with nothing deleted keeps ``base``'s scores exactly). Runs without gradients."""
    K = base.steps.shape[1]
    rows = rows.to(base.steps.device)
    log_probs, greedy = base.log_probs[rows].clone(), base.greedy[rows].clone()
    B = base.steps.shape[0]
    todo = removals.any(1).nonzero().flatten()
    with torch.no_grad():
        for start in range(0, todo.numel(), max_rows):
            idx = todo[start : start + max_rows]
            part = erase_tokens(model, gather_rows(batch, rows[idx], B), removals[idx])
            found = step_scores(model.forward_from_embeddings(model.embed(part), part))
            k = found.log_probs.shape[1]
            log_probs[idx, :k], greedy[idx, :k] = found.log_probs.to(log_probs.dtype), found.greedy
    return StepScores(log_probs=log_probs, greedy=greedy, steps=base.steps[rows][:, :K])


def _changed_steps(base: StepScores, rows: Tensor, erased: StepScores) -> Tensor:
    """``[N, K]`` bool: the explained steps of each erased row whose greedy token differs from the full input's."""
    return (erased.greedy != base.greedy[rows]) & base.steps[rows]


@torch.no_grad()
def generation_erasure(
    model: ExplainableModel,
    batch: Batch,
    scores: Tensor,
    ks: Sequence[Union[int, float]],
    *,
    attention: Tensor,
    decision_flip: bool = True,
    eraser: bool = True,
    max_rows: int = 256,
) -> Dict[str, Tensor]:
    """Erasure measures of ``R`` rankings ``scores`` ``[R, B, T]`` of a generator's source tokens (module docstring).

    Returns float64 tensors: with ``eraser``, ``comprehensiveness``, ``sufficiency`` and their ``_per_token``
    versions ``[R, len(ks), B]``; with ``decision_flip``, ``flipped`` (0/1), ``fraction_removed`` and
    ``attention_removed`` (NaN where no step flipped before one source token was left) ``[R, B]``, and
    ``steps_changed`` ``[R, B]`` at ``ks[0]``. ``attention``: ``[B, T]``, the weights whose removed mass is reported.
    The model runs in eval mode (modes restored).
    """
    out: Dict[str, Tensor] = {}
    with explanation_context(model, batch) as safe, torch.no_grad():
        mask = model.token_mask(safe)
        B, T = mask.shape
        R = scores.shape[0]
        base = step_scores(model.forward_from_embeddings(model.embed(safe), safe))
        count = base.steps.sum(1).clamp_min(1).double()
        full = base.log_probs.double().sum(1)
        used = list(ks) if eraser else list(ks[:1])
        removals = torch.stack(
            [part for r in range(R) for k in used for part in _removals(scores[r].to(mask.device), mask, k)]
        )  # [R·k·2, B, T]
        rows = torch.arange(B, device=mask.device).repeat(removals.shape[0])
        erased = erased_step_scores(model, safe, rows, removals.reshape(-1, T), base, max_rows)
        shape = (R, len(used), 2, B)
        drop = full - erased.log_probs.double().sum(1).view(shape).to(full.device)
        if eraser:
            out.update(
                comprehensiveness=drop[:, :, 0],
                sufficiency=drop[:, :, 1],
                comprehensiveness_per_token=drop[:, :, 0] / count,
                sufficiency_per_token=drop[:, :, 1] / count,
            )
        if decision_flip:
            changed = _changed_steps(base, rows, erased).sum(1).double().view(shape)
            out["steps_changed"] = changed[:, 0, 0] / count
            out.update(_greedy_flips(model, safe, scores, mask, base, attention, max_rows))
    return out


def _greedy_flips(
    model: ExplainableModel,
    batch: Batch,
    scores: Tensor,
    mask: Tensor,
    base: StepScores,
    attention: Tensor,
    max_rows: int,
) -> Dict[str, Tensor]:
    """``flipped``, ``fraction_removed``, ``attention_removed`` ``[R, B]``: source tokens deleted in ranking order
    (ties by position) until a step's greedy token changes, in blocks of deletion counts 1, 2–3, 4–7, ... (an
    instance that flipped is not scored further)."""
    R, B, T = scores.shape
    device = mask.device
    N = R * B
    source = torch.arange(B, device=device).repeat(R)
    ranked = scores.to(device).reshape(N, T).masked_fill(~mask.repeat(R, 1), float("-inf"))
    order = torch.sort(ranked, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(T, device=device).expand(N, T).contiguous())
    lengths = mask.sum(1).repeat(R)
    first = torch.full((N,), T + 1, dtype=torch.long, device=device)
    low, high = 1, 1
    while low < int(lengths.max()):
        inst_grid = torch.arange(N, device=device).repeat_interleave(high - low + 1)
        step_grid = torch.arange(low, high + 1, device=device).repeat(N)
        keep = (step_grid < lengths[inst_grid]) & (first[inst_grid] > step_grid)
        inst, step = inst_grid[keep], step_grid[keep]
        if inst.numel():
            removal = (rank[inst] < step[:, None]) & mask[source[inst]]
            erased = erased_step_scores(model, batch, source[inst], removal, base, max_rows)
            flips = _changed_steps(base, source[inst], erased).any(1)
            first.scatter_reduce_(0, inst[flips], step[flips], reduce="amin")
        low, high = high + 1, 2 * high + 1
    flipped = first <= T
    nan = torch.full((N,), float("nan"), dtype=torch.float64, device=device)
    fraction = torch.where(flipped, first.double() / lengths.double(), nan)
    mass = torch.cumsum(attention.to(device).double().masked_fill(~mask, 0.0).repeat(R, 1).gather(1, order), 1)
    removed = torch.where(flipped, mass.gather(1, (first - 1).clamp(0, T - 1)[:, None]).squeeze(1), nan)
    return {
        "flipped": flipped.double().view(R, B),
        "fraction_removed": fraction.view(R, B),
        "attention_removed": removed.view(R, B),
    }


def attention_row_gradient(model: ExplainableModel, batch: Batch) -> Tuple[Tensor, Tensor]:
    """``([B, T], [B, T])``: ``Σ_{k,h} ∂ log p(target) / ∂α_{k,h,t}`` and ``Σ_{k,h} α_{k,h,t} · ∂ log p(target) /
    ∂α_{k,h,t}`` over the source tokens ``t``, α the last layer's step rows (``extras["step_rows"]``, every head, fed
    back through ``attention_override`` so the pass is the model's own); 0 outside the source.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> _ = torch.manual_seed(0)
        >>> config = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
        >>> model = HuggingFaceAdapter(LlamaForCausalLM(config).eval())
        >>> batch = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
        ...          "labels": torch.tensor([[-100, -100, 7, 8]])}
        >>> gradient, grad_x_attention = attention_row_gradient(model, batch)
        >>> gradient.shape, bool(gradient[0, 2:].eq(0).all())
        (torch.Size([1, 4]), True)
    """
    with explanation_context(model, batch) as safe:
        embeddings = model.embed(safe).detach()
        with torch.no_grad():
            rows = model.forward_from_embeddings(embeddings, safe).extras["step_rows"].detach()
        alpha = rows.clone().requires_grad_(True)
        output = model.forward_from_embeddings(embeddings, safe, attention_override=alpha)
        assert output.target_log_probs is not None and output.target_steps is not None  # a generator's output
        score = (output.target_log_probs * output.target_steps.to(output.target_log_probs.dtype)).sum()
        (grad,) = torch.autograd.grad(score, alpha)
        mask = model.token_mask(safe)
    gradient = grad.sum((1, 2)).masked_fill(~mask, 0.0).detach()
    return gradient, (grad * rows).sum((1, 2)).masked_fill(~mask, 0.0).detach()

"""Target steps of a generation batch: which positions are explained, which query row reads each, and overrides.

A generation batch carries its target as ``labels`` (transformers' convention, -100 where nothing is explained):
``[B, T]`` aligned with ``input_ids`` for a causal LM, ``[B, S]`` beside the source for an encoder–decoder. The
``k``-th *target step* of a row is its ``k``-th explained position, counted in order, so a step keeps its number
when source tokens are deleted or padding is trimmed (positions move, ordinals do not).

* :func:`target_steps` — every target token as ``(row, position, step)`` triples, and the ``[B, K]`` step mask;
* :func:`query_positions` — the query row that predicts each step: position ``s − 1`` of a causal LM (logits at
  ``s − 1`` score the token at ``s``), position ``s`` of a decoder fed ``shift_right(labels)``;
* :func:`step_rows` — those rows of a ``[B, heads, Q, K]`` attention map as ``[B, K_steps, heads, K]``;
* :func:`step_override_rows` — the ``make_rows`` of an :class:`~lightning_xai.adapters.huggingface.attention.
  OverrideState` that replaces every step's row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

__all__ = ["IGNORE_INDEX", "Steps", "step_override_rows", "step_rows", "target_steps"]

#: the label that marks a position as not explained (transformers' ``CrossEntropyLoss`` ``ignore_index``)
IGNORE_INDEX = -100


@dataclass
class Steps:
    """Every target token of a batch.

    Attributes:
        rows: ``LongTensor[N]``: the row of each target token (row-major order).
        positions: ``LongTensor[N]``: its position in ``labels``.
        ranks: ``LongTensor[N]``: its step number ``k`` within its row (0, 1, ...).
        queries: ``LongTensor[N]``: the query position whose output predicts it.
        mask: ``[B, K]`` bool: True where row ``b`` has a ``k``-th target token (``K`` = most steps in a row).
    """

    rows: Tensor
    positions: Tensor
    ranks: Tensor
    queries: Tensor
    mask: Tensor

    def compact(self, values: Tensor) -> Tensor:
        """``[B, K, ...]``: ``values`` ``[N, ...]`` (one per target token) placed at their steps, 0 elsewhere."""
        B, K = self.mask.shape
        out = values.new_zeros((B, K) + tuple(values.shape[1:]))
        return out.index_put((self.rows, self.ranks), values)


def target_steps(labels: Tensor, causal: bool) -> Steps:
    """The target tokens of ``labels`` (``!= -100``), their step numbers and the query positions that predict them.

    Raises:
        ValueError: a causal row whose first position is a target (nothing before it predicts it, so it has no
            prompt), or a row without any target token.

    Example:
        >>> steps = target_steps(torch.tensor([[-100, -100, 7, 8], [-100, 5, -100, -100]]), causal=True)
        >>> steps.ranks.tolist(), steps.queries.tolist(), steps.mask.tolist()
        ([0, 1, 0], [1, 2, 0], [[True, True], [True, False]])
    """
    if labels.dim() != 2 or labels.is_floating_point():
        raise ValueError(
            f"labels must be an integer [B, S] tensor (-100 where nothing is explained); got "
            f"{labels.dtype} {tuple(labels.shape)}."
        )
    explained = labels != IGNORE_INDEX
    empty = (~explained.any(1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(
            f"rows {empty.tolist()[:10]} have no target token (labels are all -100), so there is nothing "
            "to explain; give every row a target, or build one with adapter.greedy_targets(batch)."
        )
    if causal and labels.shape[1] and bool(explained[:, 0].any()):
        first = explained[:, 0].nonzero().flatten().tolist()[:10]
        raise ValueError(
            f"rows {first} have a target token at position 0: a causal LM's logits at position s - 1 "
            "predict the token at s, so the first token cannot be explained, and a row whose target "
            "starts at 0 has no prompt to explain it with. Set labels to -100 on the prompt "
            "(labels = input_ids with the prompt positions masked)."
        )
    rows, positions = explained.nonzero(as_tuple=True)
    ranks = (explained.long().cumsum(1) - 1)[rows, positions]
    counts = explained.sum(1)
    K = int(counts.max()) if counts.numel() else 0
    mask = torch.arange(K, device=labels.device)[None, :] < counts[:, None]
    return Steps(rows, positions, ranks, positions - 1 if causal else positions, mask)


def step_rows(maps: Tensor, steps: Steps) -> Tensor:
    """``[B, K, heads, keys]``: each target step's query row of ``maps`` ``[B, heads, Q, keys]`` (0 at missing steps).

    Example:
        >>> steps = target_steps(torch.tensor([[-100, 4, 5]]), causal=True)
        >>> step_rows(torch.arange(9.0).view(1, 1, 3, 3), steps)[0, :, 0].tolist()
        [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """
    return steps.compact(maps[steps.rows, :, steps.queries])


def step_override_rows(
    override: Tensor, steps: Steps, key_mask: Tensor, token_mask: Tensor, specials: str
) -> Callable[[Tensor], Tensor]:
    """How an ``attention_override`` of a generation model turns a layer's weights into the replaced step rows.

    Args:
        override: ``[B, T]`` one distribution over the real (source) tokens for every step, ``[B, K, T]`` one per
            step, or ``[B, K, heads, T]`` raw rows per step and head (``extras["step_rows"]`` of a pass; pads forced
            to 0), used as given.
        steps: the batch's :class:`Steps`.
        key_mask: ``[B, T]`` bool: the key positions that are not padding.
        token_mask: ``[B, T]`` bool: the real (source/prompt) tokens.
        specials: ``"keep"``: each head keeps its own mass on every key outside the token mask (special tokens, and
            a causal LM's earlier target tokens) and gives the rest to the override; ``"zero"``: the row becomes
            the override.

    Returns:
        ``make_rows(weights [B, H, Q, T]) -> [B, H, Q, T]`` with the step rows replaced (other rows as they were).

    Example:
        >>> steps = target_steps(torch.tensor([[-100, -100, 9]]), causal=True)
        >>> make = step_override_rows(torch.tensor([[1.0, 0.0, 0.0]]), steps, torch.ones(1, 3, dtype=torch.bool),
        ...                           torch.tensor([[True, True, False]]), "keep")
        >>> own = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.25, 0.25], [0.2, 0.3, 0.5]]]])
        >>> make(own)[0, 0, 1].tolist()  # step 0 is read at query 1; it keeps 0.25 on the target token
        [0.75, 0.0, 0.25]
    """
    B, K = steps.mask.shape
    T = token_mask.shape[1]
    if override.dim() == 2 and tuple(override.shape) == (B, T):
        per_step = override.masked_fill(~token_mask, 0.0)[steps.rows]
    elif override.dim() == 3 and tuple(override.shape) == (B, K, T):
        per_step = override.masked_fill(~token_mask[:, None, :], 0.0)[steps.rows, steps.ranks]
    elif override.dim() == 4 and override.shape[:2] == (B, K) and override.shape[3] == T:
        raw = override[steps.rows, steps.ranks] * key_mask[steps.rows][:, None, :].to(override.dtype)

        def make_raw(own: Tensor) -> Tensor:
            if raw.shape[1] != own.shape[1]:
                raise ValueError(f"attention_override has {raw.shape[1]} heads; the layer has {own.shape[1]}.")
            proposed = own.clone()
            proposed[steps.rows, :, steps.queries] = raw.to(own.dtype)
            return proposed

        return make_raw
    else:
        raise ValueError(
            f"attention_override has shape {tuple(override.shape)}; a generation model takes [B, T] = "
            f"{(B, T)} (one distribution over the source tokens for every target step), [B, K, T] = "
            f"{(B, K, T)} (one per step) or [B, K, heads, T] raw rows (extras['step_rows'])."
        )
    other = (~token_mask)[steps.rows][:, None, :]

    def make_rows(own: Tensor) -> Tensor:
        rows = own[steps.rows, :, steps.queries]  # [N, H, T]
        proposal = per_step[:, None, :].to(own.dtype)
        if specials == "zero":
            new = proposal.expand_as(rows)
        else:
            kept = rows * other
            new = kept + proposal * (1 - kept.sum(dim=-1, keepdim=True))
        proposed = own.clone()
        proposed[steps.rows, :, steps.queries] = new
        return proposed

    return make_rows

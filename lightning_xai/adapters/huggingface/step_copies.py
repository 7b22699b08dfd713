"""Per-step maps of a generator in cheap passes: one copy of a row per explained step, cut to what that step reads.

A per-step map explains one step's log-probability ``log p(y_k | y_<k, source)``. A transformers decoder is causal,
so that log-probability reads the decoder positions up to the step's query row and nothing after it, and only that
row's logits. :func:`step_passes` builds, for every ``(row, step)`` pair, a copy of the row that

* keeps the decoder positions up to the step's query (an encoder–decoder's ``decoder_input_ids`` from the *full*
  labels, ``labels`` -100 except at the step, so the copy has one step, step 0; a causal LM's columns cut after
  the step, its later labels -100, so the step keeps its number ``k``);
* drops an encoder–decoder's trailing source columns that no copy of the pass attends to (``attention_mask`` 0);
* is flagged (:data:`STEP_LOGITS_ONLY`) so that the adapter computes the vocabulary logits at the steps' query rows
  only (:func:`logits_at_queries`), not at every position of every copy.

Copies are sorted by how many positions they keep and packed in passes of at most ``tokens_per_pass`` padded
tokens, so passes stay dense. Cut positions and pads never reach the explained row (causal and padding masks give
them exactly zero weight): the maps equal those of the whole rows up to float summation order; the cut columns of a
map are 0 (pads, or a causal LM's later target tokens, which are not in its ``token_mask``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, NamedTuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.huggingface.decoding import DECODER_KEYS
from lightning_xai.adapters.huggingface.steps import IGNORE_INDEX, Steps
from lightning_xai.adapters.protocol import Batch

__all__ = ["STEP_LOGITS_ONLY", "StepPass", "logits_at_queries", "step_passes"]

#: a batch flag: ``forward_from_embeddings`` returns logits ``[B, K, V]`` at the steps' query rows only
STEP_LOGITS_ONLY = "step_logits_only"


class StepPass(NamedTuple):
    """One pass of copies: copy ``i`` explains step ``ranks[i]`` of row ``rows[i]`` as its step ``target[i]``."""

    rows: Tensor
    ranks: Tensor
    batch: Dict[str, Any]
    target: Tensor


def _last_real(mask: Tensor) -> Tensor:
    """``[B]``: one past each row's last nonzero column of ``mask`` ``[B, T]`` (0 for an empty row)."""
    columns = torch.arange(1, mask.shape[1] + 1, device=mask.device)
    return (mask.bool() * columns).amax(1) if mask.shape[1] else mask.new_zeros(mask.shape[0], dtype=torch.long)


def _gather(batch: Batch, rows: Tensor, batch_size: int) -> Dict[str, Any]:
    """Rows ``rows`` of every tensor whose leading size is ``batch_size``, other tensors and scalars as they are.

    Per-row lists (gold links, words) are left out: the adapter reads tensors only, and a pass of many copies would
    carry (and every ``attribute`` call re-check) one copy of them per copy."""
    out: Dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == batch_size:
            out[key] = value.index_select(0, rows.to(value.device))
        elif not (isinstance(value, (list, tuple)) and len(value) == batch_size):
            out[key] = value
    return out


def _cut(value: Any, width: int, batch_size: int, full: int) -> Any:
    if isinstance(value, Tensor) and value.dim() >= 2 and value.shape[0] == batch_size and value.shape[1] == full:
        return value[:, :width]
    return value


def step_passes(
    adapter: Any, batch: Batch, steps: Steps, wanted: Tensor, decoder: Dict[str, Tensor], tokens_per_pass: int
) -> List[StepPass]:
    """The passes of every ``(row, step)`` pair where ``wanted`` (``[B, K]`` bool) is true (see the module docstring).

    Args:
        adapter: a :class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`.
        batch: the generation batch.
        steps: its :class:`~lightning_xai.adapters.huggingface.steps.Steps`.
        wanted: ``[B, K]`` bool, the pairs to explain (a subset of ``steps.mask``).
        decoder: an encoder–decoder's decoder inputs from the full labels (``{}`` for a causal LM).
        tokens_per_pass: padded tokens (source and decoder positions) per pass.
    """
    labels = batch["labels"]
    B, S = labels.shape
    keep = wanted.to(steps.mask.device)[steps.rows, steps.ranks]
    rows, positions, ranks = steps.rows[keep], steps.positions[keep], steps.ranks[keep]
    cut = positions + 1
    base = dict(batch, **decoder)
    T = int(batch["input_ids"].shape[1])
    source_mask = base.get("attention_mask")
    if adapter.encoder_decoder and isinstance(source_mask, Tensor) and tuple(source_mask.shape) == (B, T):
        source = _last_real(source_mask.to(cut.device))[rows]
    else:
        source = torch.full_like(cut, T if adapter.encoder_decoder else 0)
    order = torch.argsort(cut * (T + 1) + source, stable=True)
    cut_list, source_list = cut[order].tolist(), source[order].tolist()
    passes: List[StepPass] = []
    start, widest, longest = 0, 0, 0
    for i in range(len(cut_list) + 1):
        if i < len(cut_list):
            w, s = max(widest, cut_list[i]), max(longest, source_list[i])
            if i == start or (i + 1 - start) * (w + s) <= tokens_per_pass:
                widest, longest = w, s
                continue
        index = order[start:i]
        passes.append(_one_pass(adapter, base, rows[index], positions[index], ranks[index], widest, longest, T, S))
        if i < len(cut_list):
            start, widest, longest = i, cut_list[i], source_list[i]
    return passes


def _one_pass(
    adapter: Any, base: Batch, rows: Tensor, positions: Tensor, ranks: Tensor, width: int, source: int, T: int, S: int
) -> StepPass:
    B = base["labels"].shape[0]
    part = _gather(base, rows, B)
    N = rows.shape[0]
    at = torch.arange(N, device=positions.device)
    labels = part["labels"]
    if adapter.encoder_decoder:
        out = {
            k: (v[:, :width] if k in DECODER_KEYS and isinstance(v, Tensor) else _cut(v, source, N, T))
            for k, v in part.items()
        }
        only = torch.full_like(out["labels"], IGNORE_INDEX)
        only[at, positions.to(only.device)] = labels[at, positions.to(labels.device)]
        out["labels"], target = only, torch.zeros_like(ranks)
    else:
        out = {k: _cut(v, width, N, T) for k, v in part.items()}
        later = torch.arange(width, device=labels.device)[None, :] > positions.to(labels.device)[:, None]
        out["labels"], target = out["labels"].masked_fill(later, IGNORE_INDEX), ranks
    out[STEP_LOGITS_ONLY] = True
    return StepPass(rows, ranks, out, target)


@contextmanager
def logits_at_queries(model: nn.Module, steps: Steps) -> Iterator[bool]:
    """Inside: ``model``'s output embedding (its LM head) reads each step's query row only, so the model's logits
    are ``[N, 1, V]``, one row per target step in ``steps``' order; yields whether it could (a model without an
    output embedding module computes every position's logits)."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, nn.Module):
        yield False
        return

    def gather(module: nn.Module, args: Any) -> Any:
        hidden = args[0]
        return (hidden[steps.rows.to(hidden.device), steps.queries.to(hidden.device)][:, None], *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield True
    finally:
        handle.remove()

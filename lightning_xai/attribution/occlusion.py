"""Leave-one-out: how much the target probability drops when one token is deleted or replaced by the pad."""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from typing import Any, Collection, Optional, Union

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import DeletionLogits, head_kind_of, target_keys
from lightning_xai.adapters.protocol import Batch, ExplainableModel
from lightning_xai.attribution import batching
from lightning_xai.attribution.batching import (
    _keep_width,
    gather_rows,
    length_chunks,
    pad_embeddings,
    padding_trimmer,
    remove_tokens,
    row_extents,
)
from lightning_xai.attribution.gradients import _rows_per_pass
from lightning_xai.attribution.registry import register_method
from lightning_xai.attribution.targets import resolve_target, target_score

__all__ = ["LOO_MODES", "leave_one_out", "occlusion_batch"]

LOO_MODES = ("delete", "pad")


def _parameters(model: Any) -> list:
    """The model's parameters, if it is (or wraps) an ``nn.Module``; none otherwise."""
    return list(model.parameters()) if isinstance(model, torch.nn.Module) else []


def occlusion_batch(
    batch: Batch, rows: Tensor, positions: Tensor, batch_size: int, *, keep: Collection[str] = ()
) -> dict:
    """One variant per ``(rows[k], positions[k])``: row ``rows[k]`` of ``batch`` with that token deleted.

    Every per-token value (``input_ids``, ``mask``, ``input_mask``, ``impermissible``, ``rationale``, ...) loses
    the same position and shifts left, so the masks shrink with the ids; per-example values are repeated. The keys
    in ``keep`` (an encoder–decoder's target, :func:`~lightning_xai.adapters.capabilities.target_keys`) only follow
    their rows.

    Example:
        >>> b = {"input_ids": torch.tensor([[5, 6, 7]]), "mask": torch.ones(1, 3, dtype=torch.bool),
        ...      "labels": torch.tensor([1])}
        >>> v = occlusion_batch(b, torch.tensor([0, 0, 0]), torch.tensor([0, 1, 2]), 1)
        >>> v["input_ids"].tolist(), v["labels"].tolist()
        ([[6, 7], [5, 7], [5, 6]], [1, 1, 1])
    """
    variants = gather_rows(batch, rows, batch_size)
    width = next(
        v.shape[1] for v in batch.values() if isinstance(v, Tensor) and v.dim() >= 2 and v.shape[0] == batch_size
    )
    remove = torch.zeros(rows.numel(), width, dtype=torch.bool, device=rows.device)
    remove[torch.arange(rows.numel(), device=rows.device), positions] = True
    return remove_tokens(variants, remove, keep=keep)


@register_method("leave_one_out", resolves_target=True, precision_sensitive=True)
def leave_one_out(
    model: ExplainableModel,
    batch: Batch,
    target: Any,
    *,
    create_graph: bool = False,
    mode: str = "delete",
    signed: bool = False,
    internal_batch_size: Union[int, str, None] = "auto",
    output: Optional[str] = None,
    pad_token_id: Optional[int] = None,
) -> Tensor:
    """``[B, T]``: score(x) − score(x without token t) for every real token t (\\|·\\| unless ``signed``).

    ``mode="delete"`` removes the token (the sequence gets one shorter, as in Jain & Wallace);
    ``mode="pad"`` replaces its input embedding by the pad token's (a Captum ``FeatureAblation`` with the pad
    embedding as baseline). Only real tokens get a variant — Σ_b L_b forward rows, not B × T.

    The variants are sorted by length and batched (:func:`~lightning_xai.attribution.batching.length_chunks`),
    each pass trimmed to its longest variant, so a short sentence's variants do not run at the batch's width.
    ``internal_batch_size="auto"`` gives a pass the token budget of
    :func:`~lightning_xai.attribution.gradients.auto_internal_batch_size` rows at the batch's full width
    (more rows when they are shorter); an int ``n`` means at most ``n`` variants a pass, each pass as wide as
    its longest variant. Only trailing padding is trimmed: a left-padded batch keeps its width (see
    :func:`~lightning_xai.attribution.batching.row_extents`). The scores do not depend on the batching (up to
    float rounding).

    In delete mode a model with the :class:`~lightning_xai.adapters.capabilities.DeletionLogits` capability
    scores the variants itself (the reference BiLSTM reuses its recurrent states); ``None`` from it means:
    re-run the shortened rows. For a generation model the source (prompt) tokens are deleted and the target is
    scored on each shortened source (a causal LM's labels shift with its ``input_ids``; an encoder–decoder's target
    keys stay as they are). A row with a single real token cannot be deleted into an empty sequence: in
    delete mode its token is scored in pad mode instead, with a warning.

    Precision: the scores are differences of probabilities close to each other, which bf16/fp16 rounding
    swamps (per-sentence τ with the float32 map down to 0.12). Under bf16/fp16 autocast, or on a model whose
    weights are bf16/fp16, the map is computed as asked but with a ``RuntimeWarning`` that says how to get the
    float32 map (outside autocast, ``model.float()``, or the audit callbacks, which compute leave-one-out in
    float32 and restore the weights).
    """
    if mode not in LOO_MODES:
        raise ValueError(f"Unknown leave_one_out mode {mode!r}; choose one of {list(LOO_MODES)}.")
    mask = model.token_mask(batch)
    device_type = mask.device.type
    half = sorted(
        {str(p.dtype).replace("torch.", "") for p in _parameters(model) if p.dtype in (torch.bfloat16, torch.float16)}
    )
    where = f"on a model with {'/'.join(half)} weights" if half else None
    if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) in (
        torch.bfloat16,
        torch.float16,
    ):
        where = f"under {str(torch.get_autocast_dtype(device_type)).replace('torch.', '')} autocast"
    if where is not None:
        warnings.warn(
            f"leave_one_out {where}: its scores are differences of nearby probabilities, which "
            "that rounding swamps (rankings far from float32's). For the float32 map run it outside "
            "autocast (torch.autocast(..., enabled=False)) on float32 weights (model.float()), or use the "
            "audit callbacks, which compute it in float32.",
            RuntimeWarning,
            stacklevel=3,
        )
    B, T = mask.shape
    with nullcontext() if create_graph else torch.no_grad():
        embeddings = model.embed(batch)
        logits = model.forward_from_embeddings(embeddings, batch)
        target = resolve_target(logits, target)
        full = target_score(logits, target, output, head_kind_of(model))
        keep = target_keys(model, batch)
        rows, positions = mask.nonzero(as_tuple=True)
        E = embeddings.shape[-1]
        per_pass = _rows_per_pass(internal_batch_size, T, E, embeddings.device, forward_only=True)
        # "auto": the token budget of per_pass full-width rows (at most CPU_PASS_TOKENS on CPU); an int: at most
        # that many rows a pass
        auto = internal_batch_size is None or internal_batch_size == "auto"
        max_rows = None if auto else per_pass
        max_tokens = per_pass * max(T, 1)
        if auto and embeddings.device.type == "cpu":
            max_tokens = min(max_tokens, batching.CPU_PASS_TOKENS)
        occluded = torch.empty(rows.numel(), dtype=full.dtype, device=full.device)
        by_pad = torch.ones_like(rows, dtype=torch.bool) if mode == "pad" else (mask.sum(1) == 1)[rows]
        parts = []
        chosen = (~by_pad).nonzero().flatten()  # the variants scored by deleting the token
        if mode == "delete":
            if bool(by_pad.any()):
                warnings.warn(
                    f"leave_one_out(mode='delete'): rows {rows[by_pad].tolist()[:10]} have a single real "
                    "token; deleting it leaves nothing to classify, so it is scored by replacing it with "
                    "the pad token (mode='pad').",
                    RuntimeWarning,
                    stacklevel=3,
                )
            # a model that can score deletions faster than re-running them (e.g. the BiLSTM reusing its states)
            deleted = (
                model.deletion_logits(embeddings, batch, rows[chosen], positions[chosen])
                if isinstance(model, DeletionLogits)
                else None
            )
            if deleted is not None:
                parts.append(
                    (chosen, target_score(deleted, target.index_select(0, rows[chosen]), output, head_kind_of(model)))
                )
                chosen = chosen[:0]
        if chosen.numel() or bool(by_pad.any()):  # full passes remain: trim them only where the logits allow
            trim = padding_trimmer(model, batch, B)  # the identity for a model that reads its padding
            extents = row_extents(batch, B) if trim is not _keep_width else torch.full((B,), T, dtype=torch.long)
            extents = extents.to(rows.device).index_select(0, rows)
        if chosen.numel():  # deletions re-run in full: a deleted token shortens its row by one (the rest shifts left)
            for c in length_chunks(extents[chosen] - 1, max_tokens, max_rows=max_rows):
                k = chosen[c.to(chosen.device)]
                variants = trim(occlusion_batch(batch, rows[k], positions[k], B, keep=keep), (k.numel(), T - 1))
                out = model.forward_from_embeddings(model.embed(variants), variants)
                parts.append((k, target_score(out, target.index_select(0, rows[k]), output, head_kind_of(model))))
        if bool(by_pad.any()):
            pads = pad_embeddings(model, batch, embeddings, pad_token_id=pad_token_id)
            chosen = by_pad.nonzero().flatten()
            for c in length_chunks(extents[chosen], max_tokens, max_rows=max_rows):
                k = chosen[c.to(chosen.device)]
                r, p = rows[k], positions[k]
                sub = trim(gather_rows(batch, r, B), (k.numel(), T))
                width = next(
                    v.shape[1]
                    for v in sub.values()
                    if isinstance(v, Tensor) and v.dim() >= 2 and v.shape[0] == k.numel()
                )
                # one copy of the rows (cut to the pass's width), then overwrite the single occluded vector each
                x = embeddings.index_select(0, r)[:, :width]
                at = (torch.arange(k.numel(), device=x.device), p)
                x = x.index_put(at, pads[r, p]) if create_graph else x.contiguous().index_put_(at, pads[r, p])
                out = model.forward_from_embeddings(x, sub)
                parts.append((k, target_score(out, target.index_select(0, r), output, head_kind_of(model))))
        for k, values in parts:
            occluded = occluded.index_copy(0, k, values)
        change = full.index_select(0, rows) - occluded
        scores = torch.zeros(B, T, dtype=change.dtype, device=change.device).index_put((rows, positions), change)
    return scores if signed else scores.abs()

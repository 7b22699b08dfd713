"""``"value_zeroing"``: how much each token's value vectors change a layer's outputs (Mohebbi et al., 2023).

Mohebbi, Zuidema, Chrupała & Alishahi, "Quantifying Context Mixing in Transformers" (EACL 2023). For layer ``l`` and
token ``j``, every head's value vector of ``j`` is set to zero and layer ``l`` is recomputed (attention, residual,
layer norms, feed-forward: the whole block) from the same input; ``C^l_{ij}`` is the cosine distance between the
original output ``x^l_i`` and the recomputed ``x̃^l_i``; each row is divided by its sum over the non-pad positions.
The residual connection is inside the measure, so the layers are rolled out *without* an added identity:
``R = C^L ⋯ C^1`` (as in the authors' code).
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import partial
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch
from lightning_xai.attribution.context_mixing._hf_internals import (
    UNSHARDABLE,
    Trace,
    block_tail,
    head_outputs,
    normalise_rows,
    rerun_layer,
    rollout_rows,
    tail_reproduces,
    traced_layers,
)
from lightning_xai.attribution.registry import register_method

__all__ = ["TAIL_ROWS", "value_zeroing", "value_zeroing_matrix"]


#: Rows (query ``i``, zeroed token ``j``) per call of a block's tail when ``internal_batch_size`` is ``None``.
TAIL_ROWS = 2048


def value_zeroing_matrix(
    tr: Trace,
    layer: int,
    internal_batch_size: Optional[int] = None,
    *,
    present: Optional[Tensor] = None,
    queries: Optional[Tensor] = None,
) -> Tensor:
    """``[B, T, T]`` unnormalised ``C^l_{ij}`` (query ``i``, zeroed token ``j``) for layer ``layer`` of a trace.

    Distances below 0 (float rounding of a cosine of 1) are clamped to 0.

    Zeroing token ``j``'s value vectors leaves the attention probabilities alone and changes the output projection
    of query ``i`` by exactly ``Σ_h α^h_{ij} f^h(x_j)`` (:func:`mix_vectors`), so only what follows it — residual,
    layer norms, feed-forward (:func:`block_tail`) — is re-run, on one row per ``(i, j)`` pair with both
    positions in ``present`` (default: every position) and ``i`` in ``queries`` (``[B]`` one query row per
    example; default: every row), in chunks of about ``internal_batch_size`` zeroed copies of a sequence
    (``None``: :data:`TAIL_ROWS` rows). Entries outside those pairs are 0. A block whose tail this does not know,
    or that does not reproduce the block's own output (checked on the trace), re-runs the whole block with the
    values zeroed instead (``B·T`` zeroed copies, every entry computed).
    """
    parts = tr.parts[layer]
    tail = block_tail(parts)
    if tail is None or not tail_reproduces(tr, layer, tail):
        return _rerun_matrix(tr, layer, internal_batch_size)
    x, reference, projected = tr.block_in[layer], tr.block_out[layer], tr.out_proj[layer]
    B, T, _ = x.shape
    present = torch.ones(B, T, dtype=torch.bool, device=x.device) if present is None else present.to(x.device)
    f = head_outputs(parts, tr.values[layer])  # [B, T, H, D]
    attention = tr.attentions[layer]  # [B, H, T, T]
    per_call = TAIL_ROWS if internal_batch_size is None else max(1, int(internal_batch_size)) * T
    index: List[Tuple[Tensor, Tensor, Tensor]] = []  # (b, i, j) of each row, per example
    x_rows: List[Tensor] = []
    o_rows: List[Tensor] = []
    distances: List[Tensor] = []

    def flush() -> None:
        if x_rows:
            out = tail(torch.cat(x_rows).unsqueeze(0), torch.cat(o_rows).unsqueeze(0))[0]
            ref = torch.cat([reference[b, i] for b, i, _ in index[len(distances) :]])
            distances.extend(
                (1.0 - torch.cosine_similarity(out, ref, dim=-1)).clamp_min(0).split([r.shape[0] for r in x_rows])
            )
            x_rows.clear()
            o_rows.clear()

    for b in range(B):
        keys = present[b].nonzero().flatten()
        rows = keys if queries is None else queries[b].view(1).to(x.device)
        if keys.numel() == 0 or (queries is not None and not bool(present[b, rows])):
            continue
        # Σ_h α^h_{ij} f^h(x_j) for every kept (i, j): one batched matmul over j, no [pairs, H, D] copy
        mixed = torch.einsum("hij,jhd->ijd", attention[b][:, rows][:, :, keys].to(f.dtype), f[b, keys])
        n_i, n_j = rows.numel(), keys.numel()
        index.append((torch.full((n_i * n_j,), b, device=x.device), rows.repeat_interleave(n_j), keys.repeat(n_i)))
        x_rows.append(x[b, rows].repeat_interleave(n_j, dim=0))
        o_rows.append((projected[b, rows].unsqueeze(1) - mixed.to(projected.dtype)).reshape(n_i * n_j, -1))
        if sum(r.shape[0] for r in x_rows) >= per_call:
            flush()
    flush()
    matrix = reference.new_zeros(B, T, T)
    if not index:
        return matrix
    example, i, j = (torch.cat(parts_) for parts_ in zip(*index))
    return matrix.index_put((example, i, j), torch.cat(distances))


def _rerun_matrix(tr: Trace, layer: int, internal_batch_size: Optional[int]) -> Tensor:
    """Every ``C^l_{ij}`` by re-running block ``layer`` on ``B·T`` copies of its input, copy ``(b, j)`` with
    token ``j``'s value vectors zeroed (the general path of :func:`value_zeroing_matrix`)."""
    x, reference = tr.block_in[layer], tr.block_out[layer]
    B, T, _ = x.shape
    per_chunk = T if internal_batch_size is None else max(1, min(T, int(internal_batch_size) // B))
    columns: List[Tensor] = []
    for start in range(0, T, per_chunk):
        positions = torch.arange(start, min(T, start + per_chunk), device=x.device)
        n = positions.numel()
        keep = torch.ones(B * n, T, 1, dtype=tr.values[layer].dtype, device=x.device)
        keep[torch.arange(B * n, device=x.device), positions.repeat(B)] = 0.0
        out = rerun_layer(tr, layer, x.repeat_interleave(n, dim=0), n, value_edit=partial(_zero_values, keep=keep))
        distance = (1.0 - torch.cosine_similarity(out.view(B, n, T, -1), reference.unsqueeze(1), dim=-1)).clamp_min(0)
        columns.append(distance.transpose(1, 2))  # [B, T (query i), n (zeroed j)]
    return torch.cat(columns, dim=2)


@register_method("value_zeroing", resolves_target=True, unshardable=UNSHARDABLE)
def value_zeroing(
    model: Any,
    batch: Batch,
    target: Any = None,
    *,
    create_graph: bool = False,
    layer: Optional[int] = None,
    internal_batch_size: Optional[int] = None,
) -> Tensor:
    """``[B, T]`` Mohebbi et al.'s value-zeroing scores of the classifier's summary row.

    ``C^l_{ij} = 1 − cos(x^l_i, x̃^l_{i, j zeroed})``, rows normalised to sum 1 over non-pad positions. Supports the
    BERT family (BERT, RoBERTa, MiniLM, ELECTRA), DistilBERT and the Llama family (a decoder's causal mask makes
    ``C_{ij} = 0`` for ``j > i``).

    Args:
        model: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        batch: its batch.
        target: only validated.
        create_graph: keep the graph.
        layer: ``None`` (default): the summary row of the rollout ``C^L ⋯ C^1``; an int: that layer's ``C^l`` row.
        internal_batch_size: at most about this many zeroed copies of a sequence per call of a layer's tail
            (rows = this × T; ``None``: :data:`TAIL_ROWS` rows). Only pairs of non-pad positions are computed, and
            only the pooled row of the top matrix (the rest of a layer is never re-run; see
            :func:`value_zeroing_matrix`).

    Example (DistilBERT):
        >>> import torch
        >>> from transformers import DistilBertConfig, DistilBertForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> from lightning_xai.attribution import attribute
        >>> _ = torch.manual_seed(0)
        >>> net = DistilBertForSequenceClassification(DistilBertConfig(
        ...     vocab_size=30, dim=8, n_layers=2, n_heads=2, hidden_dim=16, attn_implementation="eager"))
        >>> ids = torch.tensor([[2, 7, 8, 3]])
        >>> batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mask": (ids != 2) & (ids != 3)}
        >>> scores = attribute(HuggingFaceAdapter(net.eval()), batch, "value_zeroing")
        >>> scores.shape, bool((scores[0, 1:3] > 0).all()), bool(scores.sum() < 1)
        (torch.Size([1, 4]), True, True)
    """
    with nullcontext() if create_graph else torch.no_grad():
        tr, present, rows, layers = traced_layers(model, batch, target, layer)
        # the top matrix of the rollout (or the one layer asked for) is only read at the pooled rows
        top = len(layers) - 1
        matrices = [
            normalise_rows(
                value_zeroing_matrix(
                    tr, index, internal_batch_size, present=present, queries=rows if k == top else None
                ),
                present,
            )
            for k, index in enumerate(layers)
        ]
        return rollout_rows(matrices, rows)


def _zero_values(values: Tensor, keep: Tensor) -> Tensor:
    """The value vectors with the rows ``keep`` marks 0 zeroed (``keep``: ``[B·n, T, 1]`` of 0/1)."""
    return values * keep.to(values.dtype)

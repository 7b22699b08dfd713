"""Score many attention overrides of a ``transformers`` classifier running only its last layer and its head.

:class:`~lightning_xai.adapters.HuggingFaceAdapter`'s ``attention_override`` replaces the pooled query row(s) of
the **last** layer's attention probabilities, so every earlier layer computes the same outputs for every override
of a row. :func:`override_replay` runs the batch once with the outputs of layers ``0 … L−2`` recorded (forward hooks
on the model's layer stack, found by :func:`layer_stack`); the scorer it returns runs the model on the selected rows
with each of those layers' ``forward`` replaced, on the instance and only for that call (restored in ``finally``),
by one that returns the layer's recorded output (the same object type, its rows selected). So only the input
embedding stage, the last layer — with the override applied by the adapter's own mechanism — and the head compute:
about ``1/L`` of a full pass per override. Rows whose trailing padding reaches further back run apart, each group
cut to its longest row (reach in ``(W/2, W]``, ``(W/4, W/2]``, … of the widest row's ``W``; a left-padded batch is one
group, since only trailing columns are ever cut). The rows of a call run in passes whose last-layer attention buffers
fit a memory budget (``max_elements``, :func:`~lightning_xai.adapters.budget.budget_chunks`): without it the overrides of
a long document cost ``N × heads × T²`` floats at once.

Where the head reads one position per row, the scorer packs the overrides of a row into one sequence instead
(:mod:`~lightning_xai.adapters.huggingface.packing`: copies of the pooled query appended to the row), used only if it
gives the logits of one sequence per override on the batch.

The scorer declines (``None``) where replaying would not be the same function: a module shared by several layers
(ALBERT), a model in training mode (dropout), a single-layer model (nothing to replay), no layer stack that holds the
overridden attention module in its last layer only, or a layer that returned something other than tensors. Callers
still check it against full passes before trusting it
(:func:`~lightning_xai.attribution.override_replay.override_scorer`).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.budget import PASS_BUDGET_ELEMENTS, budget_chunks
from lightning_xai.adapters.huggingface.packing import attention_elements, packed_scorer, replaced_forwards
from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.adapters.sharding import agree_flag

__all__ = ["layer_stack", "override_replay"]

#: the batch entries the adapter reads (everything else a batch carries is irrelevant to the logits)
_READ = ("input_ids", "attention_mask", "token_type_ids", "mask")


def layer_stack(model: nn.Module, last_attention: nn.Module) -> Optional[List[nn.Module]]:
    """The model's layers in order: the ``nn.ModuleList`` of ``config.num_hidden_layers`` modules whose last one
    holds ``last_attention`` and no other one does; ``None`` when the model has no such list.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> model = BertForSequenceClassification(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2,
        ...                                                  num_attention_heads=2, intermediate_size=8))
        >>> [type(m).__name__ for m in layer_stack(model, model.bert.encoder.layer[1].attention.self)]
        ['BertLayer', 'BertLayer']
    """
    count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(count, int) or count < 1:
        return None
    for candidate in model.modules():
        if not isinstance(candidate, nn.ModuleList) or len(candidate) != count:
            continue
        holders = [i for i, layer in enumerate(candidate) if any(m is last_attention for m in layer.modules())]
        if holders == [count - 1]:
            return list(candidate)
    return None


def _rows_of(value: Any, rows: Tensor, size: int) -> Any:
    """``value`` with the rows ``rows`` of every tensor whose leading size is ``size`` (tuples/lists element-wise)."""
    if isinstance(value, Tensor):
        return value.index_select(0, rows.to(value.device)) if value.dim() >= 1 and value.shape[0] == size else value
    if isinstance(value, (tuple, list)):
        return type(value)(_rows_of(v, rows, size) for v in value)
    return value


def _replayable(value: Any) -> bool:
    """Whether a layer's output is made of tensors (and ``None``) only, so selecting rows of it is well defined."""
    if isinstance(value, Tensor) or value is None:
        return True
    return type(value) in (tuple, list) and all(_replayable(v) for v in value)


def _declines(adapter: Any) -> bool:
    return (
        adapter.model.training
        or not adapter.overridable
        or not adapter._attention_modules
        or adapter._last_module_calls() != 1
    )


def override_replay(
    adapter: Any,
    embeddings: Tensor,
    batch: Batch,
    *,
    pack: bool = True,
    max_elements: Optional[int] = PASS_BUDGET_ELEMENTS,
) -> Tuple[ExplainOutput, Optional[Callable[[Tensor, Optional[Tensor]], Tensor]]]:
    """``(adapter.forward_from_embeddings(embeddings, batch), scorer)``; ``scorer(rows, override)`` gives the
    ``[N, C]`` logits of rows ``rows`` of the batch under ``attention_override=override`` (``[N, T]`` or
    ``[N, heads, T]``; ``None``: none), running only the embeddings, the last layer and the head. ``scorer`` is
    ``None`` where replaying is refused (module docstring).

    Args:
        adapter: a :class:`~lightning_xai.adapters.HuggingFaceAdapter`.
        embeddings: ``embed(batch)``, ``[B, T, E]``.
        batch: the batch.
        pack: score the overrides of one row in one sequence where the head reads one position
            (:mod:`~lightning_xai.adapters.huggingface.packing`; used only if it agrees with one override per row on the
            batch); ``False``: one sequence per override.
        max_elements: memory budget of a pass, in elements: the overrides of one call run in passes whose last-layer
            attention buffers (:func:`~lightning_xai.adapters.huggingface.packing.attention_elements`) hold at most
            this many (at least one sequence a pass; default 64M, 256 MiB of float32, the budget of leave-one-out's
            reruns, :data:`~lightning_xai.adapters.budget.PASS_BUDGET_ELEMENTS`); ``None``: one pass per width group.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> from lightning_xai.adapters import HuggingFaceAdapter
        >>> config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=3, num_attention_heads=2,
        ...                     intermediate_size=16, max_position_embeddings=16, attn_implementation="eager")
        >>> adapter = HuggingFaceAdapter(BertForSequenceClassification(config).eval())
        >>> batch = {"input_ids": torch.tensor([[2, 7, 8, 3], [2, 9, 3, 0]]),
        ...          "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        ...          "mask": torch.tensor([[False, True, True, False], [False, True, False, False]])}
        >>> with torch.no_grad():
        ...     out, scorer = override_replay(adapter, adapter.embed(batch), batch)
        ...     bool(torch.allclose(scorer(torch.tensor([1, 0]), None), out.logits[[1, 0]], atol=1e-6))
        True
    """
    layers = None if _declines(adapter) else layer_stack(adapter.model, adapter._attention_modules[-1])
    if layers is None or len(layers) < 2:
        return adapter.forward_from_embeddings(embeddings, batch), None
    replayed = layers[:-1]
    recorded: List[List[Any]] = [[] for _ in replayed]

    def recorder(i: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            recorded[i].append(output)

        return hook

    handles = [layer.register_forward_hook(recorder(i)) for i, layer in enumerate(replayed)]
    try:
        out = adapter.forward_from_embeddings(embeddings, batch)
    finally:
        for handle in handles:
            handle.remove()
    if any(len(r) != 1 or not _replayable(r[0]) for r in recorded):
        return out, None
    outputs = [r[0] for r in recorded]
    size, T = embeddings.shape[0], embeddings.shape[1]
    keys = [k for k in _READ if k in batch]
    present = adapter._attention_mask(batch).bool()
    extents = (torch.arange(1, T + 1, device=present.device) * present.long()).amax(1)  # last non-pad column + 1

    def run(rows: Tensor, override: Optional[Tensor], width: int) -> Tensor:
        """One pass over ``rows``, every ``[N, T, ...]`` value cut to its first ``width`` columns."""

        def cut(value: Any) -> Any:
            if isinstance(value, Tensor):
                return value[:, :width] if width < T and value.dim() >= 2 and value.shape[1] == T else value
            return type(value)(cut(v) for v in value) if isinstance(value, (tuple, list)) else value

        part = {k: cut(_rows_of(batch[k], rows, size)) for k in keys}
        if override is not None and width < T:
            override = override[..., :width]
        with replaced_forwards(replayed, [cut(_rows_of(output, rows, size)) for output in outputs]):
            logits, _, _, _ = adapter._run(cut(embeddings.index_select(0, rows)), part, override, maps=False)
        return logits

    def scorer(rows: Tensor, override: Optional[Tensor]) -> Tensor:
        rows = rows.to(embeddings.device)
        reach = extents.index_select(0, rows.to(extents.device)).clamp(min=1)
        # rows whose trailing padding can be cut run apart, in passes as wide as their longest row: reach in
        # (W/2, W], (W/4, W/2], ... of the widest row's W (left padding: every row reaches the last column); the
        # rows of a group run in chunks whose last-layer attention fits the budget
        group = torch.floor(torch.log2(int(reach.max()) / reach.double())).long()
        logits: Optional[Tensor] = None
        for g in torch.unique(group).tolist():
            idx = (group == g).nonzero().flatten()
            width = int(reach[idx].max())
            costs = attention_elements(adapter, torch.full((idx.numel(),), width, dtype=torch.long))
            for start, end in budget_chunks(costs, max_elements):
                part = idx[start:end]
                if part.numel() == rows.numel():  # one pass of every row, in the given order
                    return run(rows, override, width)
                scored = run(
                    rows.index_select(0, part.to(rows.device)),
                    None if override is None else override.index_select(0, part.to(override.device)),
                    width,
                )
                logits = scored.new_empty(rows.numel(), scored.shape[1]) if logits is None else logits
                logits[part.to(logits.device)] = scored
        assert logits is not None  # reach.max() above needs rows: there is a group
        return logits

    packed = packed_scorer(adapter, embeddings, batch, layers, outputs, scorer, max_elements) if pack else None
    if packed is not None and _agrees(packed, scorer, out.logits, adapter.token_mask(batch)):
        packed.checked_logits = out.logits
        return out, packed
    return out, scorer


def _agrees(
    packed: Callable[[Tensor, Optional[Tensor]], Tensor],
    scorer: Callable[[Tensor, Optional[Tensor]], Tensor],
    logits: Tensor,
    mask: Tensor,
) -> bool:
    """Whether the packed scorer gives the pass's logits on two copies of every row in one sequence (the model's own
    attention), and the one-override-per-row replay's logits under uniform and rising attention over the real tokens
    of the two longest and the two shortest rows (two copies each in one sequence)."""

    def close(a: Tensor, b: Tensor) -> bool:
        return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5))

    every = torch.arange(mask.shape[0], device=mask.device).repeat_interleave(2)
    by_length = torch.sort(mask.sum(1), stable=True).indices
    rows = torch.unique(torch.cat([by_length[:2], by_length[-2:]])).repeat_interleave(2)
    real = mask.index_select(0, rows).double()
    rising = real * torch.arange(1, mask.shape[1] + 1, device=mask.device, dtype=torch.float64)
    weights = torch.where(torch.arange(rows.numel(), device=mask.device).view(-1, 1) % 2 == 0, real, rising)
    varied = weights / weights.sum(1, keepdim=True).clamp(min=1e-12)
    try:  # agree_flag: on a sharded model every process takes process 0's branch (adapters.sharding.lockstep)
        return agree_flag(close(packed(every, None), logits.index_select(0, every))) and agree_flag(
            close(packed(rows, varied), scorer(rows, varied))
        )
    except Exception:  # noqa: BLE001 - a layout the model does not take: keep the replay
        return False

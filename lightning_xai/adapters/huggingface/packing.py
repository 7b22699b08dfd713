"""Score many attention overrides of one row in one sequence: copies of the pooled query appended as extra positions.

:mod:`~lightning_xai.adapters.huggingface.replay` replays every layer before the last and runs the last layer once per
override, over all ``T`` positions, although the head reads one position. When the classifier reads a single
pooled position per row (the ``[CLS]`` of the BERT family, the last non-pad token of a decoder), the overrides of one
row differ only in that position's attention row, and everything after a layer's attention is position-wise. So
``M`` overrides of a row are packed into **one** sequence of ``T + M`` positions: the row's own positions, then
``M`` copies of the pooled position (the same layer input, the same ``position_ids``, so the same query), which no
position may attend to (``attention_mask`` 0) and each of which gets one override. The last layer then costs
``T + M`` positions instead of ``M · T``. A second pass, one column wide with every layer replayed, feeds each copy's
output to the model's own head (its pooler, final norm, classifier), so no head is re-implemented here.

:func:`packed_scorer` declines (``None``) where a copy would not be the pooled query: a head that averages positions,
an explicit ``query_index``, a sliding-window attention (a copy sits further away than the row's positions), or
tensors it cannot lay out. The caller checks it against the one-override-per-row replay before using it.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from lightning_xai.adapters.budget import PASS_BUDGET_ELEMENTS, budget_chunks
from lightning_xai.adapters.huggingface.attention import (
    OverrideState,
    active_override,
    override_rows,
    recording_attention,
)
from lightning_xai.adapters.huggingface.pooling import pooled_logits

__all__ = ["ATTENTION_COPIES", "attention_elements", "packed_scorer", "replaced_forwards"]

#: ``[N, heads, W, W]`` float buffers of the last layer alive at once in a replayed pass: the scores, the weights, the
#: override's copy of them and its result (measured: a packed pass peaks at about 4.5 floats per attention element)
ATTENTION_COPIES = 4

#: config fields of attention restricted to a window: a copy appended after the row would see other keys
_WINDOWED = ("sliding_window", "local_attention", "attention_window")


@contextlib.contextmanager
def replaced_forwards(layers: Sequence[nn.Module], values: Sequence[Any]) -> Iterator[None]:
    """Inside the block, ``layers[i]`` returns ``values[i]`` whatever it is called with (set on the instance,
    restored on exit)."""
    saved = [layer.__dict__.get("forward") for layer in layers]
    for layer, value in zip(layers, values):
        layer.forward = (lambda v: lambda *args, **kwargs: v)(value)
    try:
        yield
    finally:
        for layer, forward in zip(layers, saved):
            if forward is None:
                del layer.forward
            else:
                layer.forward = forward


def _map_tensors(value: Any, fn: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(value, Tensor):
        return fn(value)
    return type(value)(_map_tensors(v, fn) for v in value) if isinstance(value, (tuple, list)) else value


def attention_elements(adapter: Any, widths: Tensor) -> Tensor:
    """``LongTensor[N]``: the elements of the last layer's attention buffers of sequences ``widths`` wide
    (:data:`ATTENTION_COPIES` × heads × width², ``config.num_attention_heads`` heads, 1 where the config has none):
    what a replayed pass holds per sequence, the cost its memory budget counts.

    Example:
        >>> from types import SimpleNamespace
        >>> from transformers import BertConfig
        >>> adapter = SimpleNamespace(model=SimpleNamespace(config=BertConfig(num_attention_heads=2)))
        >>> attention_elements(adapter, torch.tensor([10, 100])).tolist()
        [800, 80000]
    """
    heads = getattr(getattr(adapter.model, "config", None), "num_attention_heads", None)
    heads = heads if isinstance(heads, int) and heads >= 1 else 1
    widths = widths.long()
    return ATTENTION_COPIES * heads * widths * widths


def _accepts(module: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


Scorer = Callable[[Tensor, Optional[Tensor]], Tensor]


def packed_scorer(
    adapter: Any,
    embeddings: Tensor,
    batch: Any,
    layers: List[nn.Module],
    outputs: List[Any],
    fallback: Scorer,
    max_elements: Optional[int] = PASS_BUDGET_ELEMENTS,
) -> Optional[Scorer]:
    """A scorer ``(rows, override) -> [N, C]`` logits packing each row's overrides into one sequence, or ``None``.

    Args:
        adapter: the :class:`~lightning_xai.adapters.HuggingFaceAdapter` (eval mode, overridable).
        embeddings: ``embed(batch)``, ``[B, T, E]``.
        batch: the batch.
        layers: the model's layer stack (:func:`~lightning_xai.adapters.huggingface.replay.layer_stack`).
        outputs: the recorded outputs of every layer but the last, from the pass over ``batch``.
        fallback: the one-override-per-row scorer, for rows already as long as the model's position table
            (``config.max_position_embeddings``: no room for a copy).
        max_elements: memory budget of a pass: the sequences of a call run in passes whose last-layer attention
            buffers (:func:`attention_elements`) hold at most this many elements (at least one sequence a pass);
            ``None``: one pass per width bucket.
    """
    model, config = adapter.model, getattr(adapter.model, "config", None)
    if adapter._head_pooling not in ("first", "last") or adapter.pooling == "index":
        return None
    if any(getattr(config, name, None) is not None for name in _WINDOWED) or any(
        t != "full_attention" for t in (getattr(config, "layer_types", None) or ())
    ):
        return None
    qmask = adapter.query_mask(batch)
    if not bool((qmask.sum(-1) == 1).all()):
        return None
    B, T = qmask.shape
    pooled = qmask.long().argmax(-1)
    given = adapter._attention_mask(batch)
    present = given.bool()
    token_mask = adapter.token_mask(batch).bool()
    extents = torch.maximum((torch.arange(1, T + 1, device=present.device) * present.long()).amax(1), pooled + 1)
    limit = getattr(config, "max_position_embeddings", None)
    room = extents.new_full((B,), T) if not isinstance(limit, int) or limit < 1 else limit - extents
    body = getattr(model, getattr(model, "base_model_prefix", ""), model) if adapter._head_pooling == "last" else model
    with_positions = _accepts(body, "position_ids")
    replayed, last = layers[:-1], layers[-1]

    def is_laid_out(value: Tensor) -> bool:
        return value.dim() >= 2 and value.shape[0] == B and value.shape[1] == T

    def run(kwargs: dict) -> Tensor:
        with recording_attention(model):
            if adapter._head_pooling == "last":
                rows = kwargs["inputs_embeds"].shape[0]
                return pooled_logits(model, kwargs, torch.zeros(rows, dtype=torch.long))[0]
            return model(**kwargs).logits

    def kwargs_for(source: Tensor, index: Tensor, keys_visible: Tensor) -> Tuple[dict, Callable[[Tensor], Tensor]]:
        """The model's inputs for sequences whose column ``c`` is column ``index[:, c]`` of batch row ``source``,
        and the function that lays out any ``[B, T, ...]`` tensor so."""

        def lay(value: Tensor) -> Tensor:
            return value.index_select(0, source)[torch.arange(source.numel(), device=value.device)[:, None], index]

        kwargs = {
            "inputs_embeds": lay(embeddings),
            "attention_mask": keys_visible.to(given.dtype),
            "output_attentions": False,
            "output_hidden_states": False,
            "return_dict": True,
        }
        if "token_type_ids" in batch:
            kwargs["token_type_ids"] = lay(batch["token_type_ids"])
        if with_positions:
            kwargs["position_ids"] = index
        return kwargs, lay

    def score(rows: Tensor, override: Optional[Tensor]) -> Tensor:
        rows = rows.to(present.device)
        full = room[rows] < 1
        if not rows.numel():
            return fallback(rows, override)
        if bool(full.any()):  # rows as long as the position table: one sequence per override
            logits = None
            for part, fn in ((full, fallback), (~full, pack)):
                idx = part.nonzero().flatten()
                if idx.numel():
                    found = fn(rows[idx], None if override is None else override.index_select(0, idx))
                    logits = found.new_empty(rows.numel(), found.shape[1]) if logits is None else logits
                    logits[idx] = found
            assert logits is not None  # rows is not empty, so one of the parts scored some
            return logits
        return pack(rows, override)

    def pack(rows: Tensor, override: Optional[Tensor]) -> Tensor:
        N = rows.numel()
        # slot j of row r: sequences of a row's extent plus at most max(extent, 8) copies of its pooled position
        order = torch.sort(rows, stable=True).indices
        sorted_rows = rows[order]
        first = torch.searchsorted(sorted_rows, sorted_rows, right=False)
        rank = torch.arange(N, device=rows.device) - first  # the override's place among its row's overrides
        extent = extents[sorted_rows]
        cap = torch.minimum(torch.clamp(extent, min=8), room[sorted_rows])
        chunk = rank // cap
        keys = torch.stack([sorted_rows, chunk], 1)
        groups, group_of = torch.unique(keys, dim=0, return_inverse=True)
        G = groups.shape[0]
        source = groups[:, 0]
        first_in_group = torch.full((G,), N, dtype=torch.long, device=rows.device).scatter_reduce(
            0, group_of, torch.arange(N, device=rows.device), reduce="amin"
        )
        column = extent + (torch.arange(N, device=rows.device) - first_in_group[group_of])  # the copy's position
        sizes = torch.bincount(group_of, minlength=G)
        widths = extents[source] + sizes
        logits: Optional[Tensor] = None
        # sequences as wide as their group's longest: width in (W/2, W], (W/4, W/2], ... of the widest W
        bucket = torch.floor(torch.log2(int(widths.max()) / widths.double())).long()
        for b in torch.unique(bucket).tolist():
            members = (bucket == b).nonzero().flatten()
            # sequences in passes that fit the budget, each counted at the bucket's widest (a pass may be that wide)
            costs = attention_elements(adapter, widths.index_select(0, members).max().expand(members.numel()))
            for start, end in budget_chunks(costs, max_elements):
                chunk = members[start:end]
                chosen = torch.zeros(G, dtype=torch.bool, device=rows.device)
                chosen[chunk] = True
                picked = chosen[group_of].nonzero().flatten()  # the overrides (in sorted order) of those groups
                local = torch.empty(G, dtype=torch.long, device=rows.device)
                local[chunk] = torch.arange(chunk.numel(), device=rows.device)
                scored = score_bucket(source[chunk], local[group_of[picked]], column[picked], order[picked], override)
                logits = scored.new_empty(N, scored.shape[1]) if logits is None else logits
                logits[order[picked]] = scored
        assert logits is not None  # widths.max() above needs rows: there is a bucket
        return logits

    def score_bucket(
        source: Tensor, seq: Tensor, column: Tensor, original: Tensor, override: Optional[Tensor]
    ) -> Tensor:
        """Logits of the overrides ``original`` (positions in the caller's rows), copy ``column`` of sequence
        ``seq``; sequence ``s`` lays out batch row ``source[s]``."""
        S, device = source.numel(), present.device
        width = int(column.max()) + 1
        cols = torch.arange(width, device=device).expand(S, width)
        own = cols < extents[source].view(-1, 1)
        index = torch.where(own, cols, pooled[source].view(-1, 1))  # copies (and the tail) read the pooled column
        keys_visible = own & present.index_select(0, source).gather(1, index)
        real = own & token_mask.index_select(0, source).gather(1, index)
        kwargs, lay = kwargs_for(source, index, keys_visible)
        packed = [
            _map_tensors(
                o,
                lambda v: (
                    lay(v) if is_laid_out(v) else v.index_select(0, source) if v.dim() >= 1 and v.shape[0] == B else v
                ),
            )
            for o in outputs
        ]
        copies = torch.zeros(S, width, dtype=torch.bool, device=device)
        copies[seq, column] = True
        token = None
        if override is not None:
            chosen = override.index_select(0, original.to(override.device))
            heads = chosen.shape[1:-1]  # () for [N, T] distributions, (H,) for [N, H, T] raw rows
            key_index = index[seq].view(-1, *(1,) * len(heads), width).expand(-1, *heads, width)
            kept = own[seq].view(-1, *(1,) * len(heads), width)
            make = override_rows(
                chosen.gather(-1, key_index) * kept, keys_visible[seq], real[seq], adapter.override_specials
            )

            def make_rows(weights: Tensor) -> Tensor:
                own_rows = weights[seq, :, column, :]  # [N, H, W]: each copy's own row
                proposed = make(own_rows[:, :, None, :])[:, :, 0, :]
                out = weights.clone()
                out[seq, :, column, :] = proposed
                return out

            token = active_override().set(
                OverrideState(adapter._attention_modules[-1], copies, make_rows, calls=adapter._last_module_calls())
            )
        captured: List[Any] = []
        hook = last.register_forward_hook(lambda module, args, output: captured.append(output))
        try:
            with replaced_forwards(replayed, packed):
                run(kwargs)
        finally:
            hook.remove()
            if token is not None:
                active_override().reset(token)
        if len(captured) != 1:
            raise RuntimeError("the last layer ran more than once in a packed pass")

        def copy_rows(v: Tensor) -> Tensor:
            return v[seq, column].unsqueeze(1) if v.dim() >= 2 and v.shape[:2] == (S, width) else v

        head_inputs = _map_tensors(captured[0], copy_rows)
        one = torch.ones(seq.numel(), 1, dtype=torch.bool, device=device)
        head, _ = kwargs_for(source[seq], pooled[source[seq]].view(-1, 1), one)
        with replaced_forwards(layers, [head_inputs] * len(layers)):
            return run(head)

    return score

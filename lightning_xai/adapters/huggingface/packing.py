"""Score many attention overrides of one row in one sequence: copies of the pooled query appended as extra positions.

:mod:`~lightning_xai.adapters.huggingface.replay` replays every layer before the last and runs the last layer once per
override, over all ``T`` positions, although the head reads one position. When the classifier reads a single
pooled position per row (the ``[CLS]`` of the BERT family, the last non-pad token of a decoder), the overrides of one
row differ only in that position's attention row, and everything after a layer's attention is position-wise. So
``M`` overrides of a row are packed into **one** sequence of ``T + M`` positions: the row's own positions, then
``M`` copies of the pooled position (the same layer input, the same ``position_ids``, so the same query), which no
position may attend to (``attention_mask`` 0) and each of which gets one override. The last layer then costs
``T + M`` positions instead of ``M · T``, and its attention only the copies' rows against the row's keys
(:class:`~lightning_xai.adapters.huggingface.attention.OverrideState`'s ``window``: ``M × T`` scores instead of
``(T + M)²``; the masked columns it leaves out are exact zeros of the softmax). A second pass, one column wide with every layer replayed, feeds each copy's
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
    rows_read_own,
)
from lightning_xai.adapters.huggingface.pooling import pooled_logits
from lightning_xai.adapters.sharding import is_sharded

__all__ = [
    "ATTENTION_COPIES",
    "COPIES_PER_POSITION",
    "PackedScorer",
    "attention_elements",
    "packed_scorer",
    "replaced_forwards",
]

#: ``[N, heads, W, W]`` float buffers of the last layer alive at once in a replayed pass: the scores, the weights, the
#: override's copy of them and its result (measured: a packed pass peaks at about 4.5 floats per attention element)
ATTENTION_COPIES = 4
#: copies of the pooled position per position of the row in one packed sequence (at least 8): the last layer computes
#: only the copies' attention rows, so a copy costs the same whatever their number, and each sequence repeats the
#: row's own positions (only read as keys and values) for more copies (measured on the LoRA Llama of
#: ``benchmarks/bench_audit_share.py``: 1 → 4 made the permutation test 1.4× faster, decision flip unchanged)
COPIES_PER_POSITION = 4

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


class PackedScorer:
    """The scorer :func:`packed_scorer` returns: a :class:`~lightning_xai.adapters.capabilities.PackingScorer` (the
    overrides of one row of a call share a sequence, so callers give it all of a row's overrides at once)."""

    packs_rows = True

    def __init__(self, score: Scorer) -> None:
        self._score = score
        #: the logits of the pass this scorer was found to reproduce on every row (two copies of each in one
        #: sequence, :func:`~lightning_xai.adapters.huggingface.replay.override_replay`), so that check is not run
        #: again (:func:`~lightning_xai.attribution.override_replay.override_scorer`); ``None``: not checked
        self.checked_logits: Optional[Tensor] = None

    def __call__(self, rows: Tensor, override: Optional[Tensor]) -> Tensor:
        return self._score(rows, override)


def packed_scorer(
    adapter: Any,
    embeddings: Tensor,
    batch: Any,
    layers: List[nn.Module],
    outputs: List[Any],
    fallback: Scorer,
    max_elements: Optional[int] = PASS_BUDGET_ELEMENTS,
) -> Optional[PackedScorer]:
    """A scorer ``(rows, override) -> [N, C]`` logits packing each row's overrides into one sequence (a
    :class:`PackedScorer`), or ``None``.

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
    sharded = is_sharded(model)  # asked once: every pass of the scorer would walk the model's modules again

    def is_laid_out(value: Tensor) -> bool:
        return value.dim() >= 2 and value.shape[0] == B and value.shape[1] == T

    def run(kwargs: dict) -> Tensor:
        with recording_attention(model):
            if adapter._head_pooling == "last":
                rows = kwargs["inputs_embeds"].shape[0]
                return pooled_logits(model, kwargs, torch.zeros(rows, dtype=torch.long), sharded=sharded)[0]
            return model(**kwargs).logits

    def kwargs_for(source: Tensor, index: Tensor, keys_visible: Tensor) -> Tuple[dict, Callable[[Tensor], Tensor]]:
        """The model's inputs for sequences whose column ``c`` is column ``index[:, c]`` of batch row ``source``,
        and the function that lays out any ``[B, T, ...]`` tensor so."""
        flat = (source.view(-1, 1) * T + index).flatten()  # column c of sequence s is position flat[s·W + c] of [B·T]

        def lay(value: Tensor) -> Tensor:
            gathered = value.reshape(B * T, *value.shape[2:]).index_select(0, flat.to(value.device))
            return gathered.view(*index.shape, *value.shape[2:])

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
        # slot j of row r: sequences of a row's extent plus at most max(COPIES_PER_POSITION · extent, 8) copies of its
        # pooled position
        order = torch.sort(rows, stable=True).indices
        sorted_rows = rows[order]
        first = torch.searchsorted(sorted_rows, sorted_rows, right=False)
        rank = torch.arange(N, device=rows.device) - first  # the override's place among its row's overrides
        extent = extents[sorted_rows]
        cap = torch.minimum(torch.clamp(extent * COPIES_PER_POSITION, min=8), room[sorted_rows])
        chunk = rank // cap
        # the (row, chunk) pairs as one sortable number: torch.unique over rows of a 2-column tensor compares them
        # one by one (a Python-speed loop over the N overrides), over numbers it sorts once
        per_row = int(chunk.max()) + 1
        groups, group_of = torch.unique(sorted_rows * per_row + chunk, return_inverse=True)
        G = groups.shape[0]
        source = torch.div(groups, per_row, rounding_mode="floor")
        first_in_group = torch.full((G,), N, dtype=torch.long, device=rows.device).scatter_reduce(
            0, group_of, torch.arange(N, device=rows.device), reduce="amin"
        )
        column = extent + (torch.arange(N, device=rows.device) - first_in_group[group_of])  # the copy's position
        sizes = torch.bincount(group_of, minlength=G)
        widths = extents[source] + sizes
        # sequences as wide as their group's longest: width in (W/2, W], (W/4, W/2], ... of the widest W; the
        # copies of every pass then go through the head in one pass
        heads: List[Tuple[Any, Tensor, Tensor]] = []
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
                inputs, head_rows = score_bucket(
                    source[chunk], local[group_of[picked]], column[picked], order[picked], override
                )
                heads.append((inputs, head_rows, order[picked]))
        joined = _joined_copies([inputs for inputs, _, _ in heads], [rows.numel() for _, rows, _ in heads])
        parts = (
            heads
            if joined is None
            else [(joined, torch.cat([r for _, r, _ in heads]), torch.cat([o for _, _, o in heads]))]
        )
        logits: Optional[Tensor] = None
        for inputs, head_rows, original in parts:
            scored = score_head(inputs, head_rows)
            logits = scored.new_empty(N, scored.shape[1]) if logits is None else logits
            logits[original] = scored
        assert logits is not None  # widths.max() above needs rows: there is a bucket
        return logits

    def score_head(inputs: Any, head_rows: Tensor) -> Tensor:
        """The model's own head (pooler, final norm, classifier) on the last layer's outputs ``inputs`` of copies of
        the pooled positions of batch rows ``head_rows``: a pass one column wide, every layer replayed."""
        one = torch.ones(head_rows.numel(), 1, dtype=torch.bool, device=present.device)
        head, _ = kwargs_for(head_rows, pooled[head_rows].view(-1, 1), one)
        with replaced_forwards(layers, [inputs] * len(layers)):
            return run(head)

    def score_bucket(
        source: Tensor, seq: Tensor, column: Tensor, original: Tensor, override: Optional[Tensor]
    ) -> Tuple[Any, Tensor]:
        """The last layer's outputs at the copies of the overrides ``original`` (positions in the caller's rows),
        copy ``column`` of sequence ``seq`` (sequence ``s`` lays out batch row ``source[s]``), one row per copy, and
        the batch row of each copy."""
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
            # the last layer computes only the rows from the first copy on, against the row's own keys: no query
            # sees a key past the longest row, and only the copies are read
            first, keys = int(column.min()), int(extents[source].max())
            chosen = override.index_select(0, original.to(override.device))
            heads = chosen.shape[1:-1]  # () for [N, T] distributions, (H,) for [N, H, T] raw rows
            key_index = index[seq, :keys].view(-1, *(1,) * len(heads), keys).expand(-1, *heads, keys)
            kept = own[seq, :keys].view(-1, *(1,) * len(heads), keys)
            arguments = (chosen.gather(-1, key_index) * kept, keys_visible[seq, :keys], real[seq, :keys])
            make = override_rows(*arguments, adapter.override_specials)
            row = column - first  # each copy's row in the window
            reads_own = rows_read_own(*arguments, adapter.override_specials)

            def make_rows(weights: Tensor) -> Tensor:
                if reads_own:
                    own_rows = weights[seq, :, row, None, :]  # [N, H, 1, keys]: each copy's own row
                    out = weights.clone()
                else:  # weights are zeros the attention made for this call (its own were not computed): filled here
                    own_rows = weights.new_zeros(seq.numel(), weights.shape[1], 1, weights.shape[3])
                    out = weights
                out[seq, :, row, :] = make(own_rows)[:, :, 0, :]
                return out

            token = active_override().set(
                OverrideState(
                    adapter._attention_modules[-1],
                    copies[:, first:],
                    make_rows,
                    calls=adapter._last_module_calls(),
                    window=(first, keys),
                    reads_own=reads_own,
                )
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

        return _map_tensors(captured[0], copy_rows), source[seq]

    return PackedScorer(score)


def _joined_copies(parts: List[Any], sizes: List[int]) -> Optional[Any]:
    """The last-layer outputs of several packed passes (``parts``, ``sizes[i]`` copies in part ``i``) joined along
    the copies, so that one head pass scores them all; ``None`` where a part holds anything but tensors of one row
    per copy (``[n, 1, ...]``), ``None`` leaves, and tuples or lists of them of one layout, or there is one part."""

    def per_copy(value: Any, n: int) -> bool:
        if isinstance(value, Tensor):
            return value.dim() >= 2 and value.shape[0] == n and value.shape[1] == 1
        if isinstance(value, (tuple, list)):
            return all(per_copy(v, n) for v in value)
        return value is None

    def join(values: List[Any]) -> Any:
        first = values[0]
        if isinstance(first, Tensor):
            return torch.cat(values, 0)
        if first is None:
            return None
        return type(first)(join([v[i] for v in values]) for i in range(len(first)))

    def layout(value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return type(value), tuple(layout(v) for v in value)
        return None if value is None else (Tensor, value.shape[2:], value.dtype)

    if len(parts) < 2 or not all(per_copy(p, n) for p, n in zip(parts, sizes)):
        return None
    if any(layout(p) != layout(parts[0]) for p in parts[1:]):
        return None
    return join(parts)

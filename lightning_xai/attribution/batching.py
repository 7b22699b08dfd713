"""Batch surgery shared by the attribution methods, metrics and audits: select/repeat rows, delete tokens, pad
embeddings.

A batch is a mapping of named values. Every tensor whose first dimension is the batch size ``B`` is a
per-example value and follows its rows; every tensor whose first two dimensions are ``[B, T]`` (ids, masks,
``impermissible``, ``rationale``, ...) is a per-token value and follows its tokens. Anything else (scalars,
strings, tensors of another leading size) is passed through unchanged; lists/tuples of length ``B`` are
per-example. A generator's target keys (:func:`~lightning_xai.adapters.capabilities.target_keys`, which may be as
wide as the source by chance) are per-example only: ``keep=`` leaves them out of token surgery.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Collection, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import target_keys
from lightning_xai.adapters.protocol import Batch, ExplainableModel, as_explainable
from lightning_xai.adapters.sharding import agree_flag

__all__ = [
    "batch_shape",
    "gather_rows",
    "repeat_rows",
    "remove_tokens",
    "erase_tokens",
    "replace_input_ids",
    "pad_embeddings",
    "row_extents",
    "length_chunks",
    "padding_trimmer",
    "CPU_PASS_TOKENS",
]

#: the fill of freed positions of per-token ``labels`` (transformers' ``ignore_index``: not a target)
IGNORE_LABEL = -100
#: Padded tokens per forward pass of length-sorted variants on CPU: MiniLM costs ~270 µs a token at 1-4k tokens a
#: pass, 345 at 15k (activations leave the cache); on a GPU the memory budget alone sets the pass size.
CPU_PASS_TOKENS = 4096


def batch_shape(model: ExplainableModel, batch: Batch) -> Tuple[int, int]:
    """``(B, T)`` of ``batch`` as the model's token mask sees it."""
    mask = model.token_mask(batch)
    if mask.dim() != 2:
        raise ValueError(f"token_mask(batch) must be [B, T]; got shape {tuple(mask.shape)}.")
    return int(mask.shape[0]), int(mask.shape[1])


def gather_rows(batch: Batch, rows: Tensor, batch_size: int) -> Dict[str, Any]:
    """The batch made of rows ``rows`` (a LongTensor, repeats allowed) of ``batch``: a subset, a reordering or
    copies of its rows (paths, variants), the batch size given, so nothing is guessed from the values.

    Args:
        batch: the original batch with ``batch_size`` examples.
        rows: ``[N]`` indices into the batch.
        batch_size: ``B``; values whose leading size is ``B`` are indexed, others are passed through.

    Example:
        >>> b = {"input_ids": torch.tensor([[1, 2], [3, 0]]), "labels": torch.tensor([0, 1]), "name": "x"}
        >>> gather_rows(b, torch.tensor([1, 1, 0]), 2)["input_ids"].tolist()
        [[3, 0], [3, 0], [1, 2]]
    """
    out: Dict[str, Any] = {}
    host_rows = None
    for key, value in batch.items():
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == batch_size:
            out[key] = value.index_select(0, rows.to(value.device))
        elif isinstance(value, (list, tuple)) and len(value) == batch_size:
            host_rows = rows.tolist() if host_rows is None else host_rows
            out[key] = type(value)(value[i] for i in host_rows)
        else:
            out[key] = value
    return out


def repeat_rows(batch: Batch, times: int, batch_size: int, *, interleave: bool = False) -> Dict[str, Any]:
    """The batch with each of its ``batch_size`` rows repeated ``times`` times (through :func:`gather_rows`).

    Tiled by default (rows ``0 … B−1``, then again: variant ``k`` of row ``b`` is row ``k·B + b``); with
    ``interleave`` each row's copies are adjacent (row ``b·times + k``), as ``Tensor.repeat_interleave``.

    Example:
        >>> b = {"input_ids": torch.tensor([[1, 2], [3, 0]]), "labels": torch.tensor([0, 1])}
        >>> repeat_rows(b, 2, 2)["labels"].tolist(), repeat_rows(b, 2, 2, interleave=True)["labels"].tolist()
        ([0, 1, 0, 1], [0, 0, 1, 1])
    """
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ValueError(f"times must be a positive int, got {times!r}.")
    rows = torch.arange(batch_size)
    return gather_rows(batch, rows.repeat_interleave(times) if interleave else rows.repeat(times), batch_size)


def remove_tokens(batch: Batch, remove: Tensor, *, fill: int = 0, keep: Collection[str] = ()) -> Dict[str, Any]:
    """Delete the positions where ``remove`` is True from every per-token value, shifting the rest left.

    Every ``[B, T, ...]`` tensor of the batch (``input_ids``, ``mask``, ``input_mask``, ``impermissible``,
    ``rationale``, ...) is rearranged the same way, so the masks shrink with the ids. The freed positions at
    the end are filled with ``fill`` (0: the pad id and False) — per-token ``labels`` (a causal LM's target) with
    -100, "not explained", since 0 is a token — and the width shrinks to the longest row left.

    Args:
        batch: a batch whose per-token tensors are ``[B, T, ...]``.
        remove: ``[B, T]`` bool, True where a token is deleted.
        fill: value of the freed trailing positions.
        keep: keys left as they are (not per-token even when ``[B, T]``-shaped).

    Example:
        >>> b = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]),
        ...      "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> out = remove_tokens(b, torch.tensor([[False, True, False], [True, False, False]]))
        >>> out["input_ids"].tolist(), out["mask"].tolist()
        ([[5, 7], [9, 0]], [[True, True], [True, False]])
    """
    if remove.dim() != 2 or remove.dtype != torch.bool:
        raise ValueError(f"remove must be a bool [B, T] tensor; got {remove.dtype} {tuple(remove.shape)}.")
    B, T = remove.shape
    kept = (~remove).sum(1)
    width = int(kept.max()) if B else 0
    # a stable sort puts the kept positions first, in their original order
    order = torch.sort(remove.to(torch.int8), dim=1, stable=True).indices[:, :width]
    freed = torch.arange(width, device=remove.device).unsqueeze(0) >= kept.unsqueeze(1)
    out: Dict[str, Any] = {}
    for key, value in batch.items():
        if key not in keep and isinstance(value, Tensor) and value.dim() >= 2 and tuple(value.shape[:2]) == (B, T):
            index = order.to(value.device).view(B, width, *([1] * (value.dim() - 2))).expand(B, width, *value.shape[2:])
            moved = value.gather(1, index)
            tail = freed.to(value.device).view(B, width, *([1] * (value.dim() - 2)))
            out[key] = moved.masked_fill(tail, IGNORE_LABEL if key == "labels" else fill)
        else:
            out[key] = value
    return out


def _check_remove(remove: Tensor, mask: Tensor, name: str = "remove") -> None:
    if not isinstance(remove, Tensor) or remove.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor [B, T]; got "
            f"{remove.dtype if isinstance(remove, Tensor) else type(remove).__name__}."
        )
    if remove.shape != mask.shape:
        raise ValueError(f"{name} has shape {tuple(remove.shape)} but the token mask is {tuple(mask.shape)}.")
    if bool((remove & ~mask.to(remove.device)).any()):
        raise ValueError(
            f"{name} marks positions that are not real tokens (pads or special tokens); only real "
            "tokens (model.token_mask(batch)) can be erased."
        )


def erase_tokens(model: ExplainableModel, batch: Batch, remove: Tensor) -> dict:
    """The batch with the real tokens marked in ``remove`` deleted from every row.

    The remaining tokens (special tokens such as ``<sos>``/``<eos>`` included) move left, every ``[B, T, ...]``
    tensor of the batch moves with them (:func:`remove_tokens`), and the batch narrows to its longest remaining row.
    Rows keep their order. Deleting every real token of a row is refused: models are undefined on empty inputs.

    Args:
        model: the explainable model (its ``token_mask`` says which positions are real tokens).
        batch: the batch.
        remove: ``[B, T]`` bool, True at real tokens to delete.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[5, 6, 7], [8, 9, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> erase_tokens(model, batch, torch.tensor([[False, True, False], [True, False, False]]))["input_ids"]
        tensor([[5, 7],
                [9, 0]])
    """
    mask = as_explainable(model).token_mask(batch)
    _check_remove(remove, mask)
    emptied = ((mask & ~remove.to(mask.device)).sum(1) == 0).nonzero().flatten()
    if emptied.numel():
        raise ValueError(f"remove deletes every real token of rows {emptied.tolist()[:10]}; keep at least one token.")
    keep = target_keys(model, batch)
    out = remove_tokens(batch, remove.to(mask.device), keep=keep)
    return _trim_padding(out, tuple(mask.shape), keep=keep)


def _present(batch: Batch, batch_size: int) -> Optional[Tensor]:
    """The batch's own ``[B, T]`` non-pad indicator (``input_mask``, else ``attention_mask``, else ``mask``)."""
    return next(
        (
            batch[k]
            for k in ("input_mask", "attention_mask", "mask")
            if isinstance(batch.get(k), Tensor) and batch[k].dim() == 2 and batch[k].shape[0] == batch_size
        ),
        None,
    )


def _trim_padding(batch: dict, shape: tuple, keep: Collection[str] = ()) -> dict:
    """Drop trailing columns that are padding in every row, read from the batch's own non-pad indicator
    (``input_mask``, else ``attention_mask``, else ``mask``); other batches are returned unchanged. ``keep``: keys
    left as they are."""
    B, T = shape
    present = _present(batch, B)
    if present is None or present.shape[1] == 0:
        return batch
    width_now = present.shape[1]
    columns = present.bool().any(0).nonzero().flatten()
    width = int(columns.max()) + 1 if columns.numel() else width_now
    if width == width_now:
        return batch
    return {
        key: value[:, :width]
        if key not in keep
        and isinstance(value, Tensor)
        and value.dim() >= 2
        and tuple(value.shape[:2]) == (B, width_now)
        else value
        for key, value in batch.items()
    }


def _keep_width(batch: dict, shape: tuple) -> dict:
    """The trimmer of a model that reads its padding: every pass keeps the batch's width."""
    return batch


def padding_trimmer(model: Any, batch: Batch, batch_size: int) -> Callable[[dict, tuple], dict]:
    """:func:`_trim_padding` if cutting trailing padding leaves the model's logits unchanged, else the identity.

    Checked on (up to 4 of) the rows that lose the most columns: their logits at the batch's width and trimmed must
    agree (relative 1e-4; a generation model's target log-probabilities). A model that reads its padding (an LSTM
    run over the pads) keeps the full width (:func:`_keep_width`), so trimmed passes never change its numbers. A
    generation model's target keys are never trimmed.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=10, num_classes=2, embedding_dim=4, hidden_dim=2).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 0, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, False, False]])}
        >>> padding_trimmer(model, batch, 2) is _trim_padding  # packed LSTM: the pads are never read
        True
    """
    extents = row_extents(batch, batch_size)
    present = _present(batch, batch_size)
    keep = target_keys(model, batch)
    trim = functools.partial(_trim_padding, keep=keep) if keep else _trim_padding
    if present is None or not extents.numel():
        return trim
    width = present.shape[1]
    rows = (extents == extents.min()).nonzero().flatten()[:4]  # the rows a pass cuts most
    whole = gather_rows(batch, rows, batch_size)
    cut = trim(whole, (rows.numel(), width))
    cut_present = _present(cut, rows.numel())
    assert cut_present is not None  # the rows keep the batch's non-pad indicator, gathered then trimmed
    if cut_present.shape[1] == width:
        return trim
    with torch.no_grad():
        a = _compared(model.forward_from_embeddings(model.embed(whole), whole))
        b = _compared(model.forward_from_embeddings(model.embed(cut), cut))
    if not agree_flag(bool(torch.isfinite(a).all() & torch.isfinite(b).all())):  # agree_flag: lockstep (sharding)
        return _keep_width  # NaN logits (a diverged model) cannot show the trim is safe: keep the width
    same = agree_flag(
        bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5 * float(a.abs().max().clamp_min(1))))
    )
    return trim if same else _keep_width


def _compared(output: Any) -> Tensor:
    """What a trimmed pass must reproduce: a generator's target log-probabilities (its next-token logits are as
    wide as the batch), else the logits."""
    values = getattr(output, "target_log_probs", None)
    return output.logits if values is None else values


def row_extents(batch: Batch, batch_size: int) -> Tensor:
    """``LongTensor[B]``: the width each row keeps when trailing padding is trimmed (its last non-pad column + 1).

    Read from the same non-pad indicator as the trimming (``input_mask``, else ``attention_mask``, else
    ``mask``). A right-padded row's extent is its length (special tokens included); a left-padded row reaches
    the last column, so its extent is the batch's width — only trailing columns are ever trimmed, since
    dropping leading pads would move every token's absolute position (BERT's and GPT-2's position ids count
    from column 0). A batch without such an indicator cannot be trimmed: every extent is its full width.

    Example:
        >>> b = {"input_ids": torch.tensor([[5, 6, 0], [0, 7, 8]]),
        ...      "attention_mask": torch.tensor([[1, 1, 0], [0, 1, 1]])}
        >>> row_extents(b, 2).tolist()
        [2, 3]
    """
    present = _present(batch, batch_size)
    if present is None:
        width = next(
            (v.shape[1] for v in batch.values() if isinstance(v, Tensor) and v.dim() >= 2 and v.shape[0] == batch_size),
            0,
        )
        return torch.full((batch_size,), width, dtype=torch.long)
    T = present.shape[1]
    where = torch.arange(1, T + 1, device=present.device) * present.bool().long()
    return where.amax(1) if T else torch.zeros(batch_size, dtype=torch.long, device=present.device)


def length_chunks(
    lengths: Union[Tensor, Sequence[int]],
    max_tokens: int,
    *,
    max_rows: Optional[int] = None,
    pass_cost: Optional[int] = None,
) -> List[Tensor]:
    """Variant indices grouped into forward passes, shortest first, each within a token budget.

    The variants are sorted by length (stably: equal lengths keep their order) and cut into consecutive
    passes of at most ``max_tokens`` padded tokens (``rows × longest length``; with ``max_rows``, at most that
    many rows; a variant longer than the budget gets a pass of its own). Where to cut is chosen to minimise
    the padded tokens plus ``pass_cost`` per pass (a dynamic programme over the distinct lengths): a pass that
    mixes short and long variants pays padding, one more pass pays its fixed cost. Run each pass trimmed to its
    own longest width (:func:`gather_rows`, then the trailing-padding trim of :func:`erase_tokens`): with
    ``lengths`` from :func:`row_extents` that width is the pass's last length, so short variants stop paying
    for long ones.

    Args:
        lengths: ``[N]`` widths of the variants (for a trimmed pass: their :func:`row_extents`).
        max_tokens: padded tokens (rows × width) a pass may hold.
        max_rows: optional cap on the rows of a pass.
        pass_cost: the fixed cost of a pass, in padded tokens (default ``max_tokens // 32``).

    Returns:
        LongTensors of indices into ``lengths`` (on ``lengths``' device), covering each index exactly once.

    Example:
        >>> [c.tolist() for c in length_chunks(torch.tensor([5, 2, 9, 2, 4]), max_tokens=12)]
        [[1, 3], [4], [0], [2]]
        >>> [c.tolist() for c in length_chunks([5, 2, 9, 2, 4], max_tokens=100, max_rows=2, pass_cost=4)]
        [[1, 3], [4, 0], [2]]
    """
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be one-dimensional; got shape {tuple(lengths.shape)}.")
    for name, value in (("max_tokens", max_tokens), ("max_rows", max_rows), ("pass_cost", pass_cost)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int; got {value!r}.")
    order = torch.sort(lengths, stable=True).indices
    if not order.numel():
        return []
    values, counts = torch.unique_consecutive(lengths[order], return_counts=True)
    widths = values.clamp(min=1).tolist()
    starts = [0, *torch.cumsum(counts, 0).tolist()]
    fixed = max(1, max_tokens // 32) if pass_cost is None else pass_cost

    def per_pass(width: int) -> int:
        rows = max(1, max_tokens // width)
        return rows if max_rows is None else min(rows, max_rows)

    # best[j]: least cost of the variants of the j shortest lengths; cut[j]: where its last segment starts
    best, cut = [0] + [float("inf")] * len(widths), [0] * (len(widths) + 1)
    for j in range(1, len(widths) + 1):
        width, per = widths[j - 1], per_pass(widths[j - 1])
        for i in range(j - 1, -1, -1):
            rows = starts[j] - starts[i]
            if rows * width >= best[j]:  # longer segments only cost more
                break
            cost = best[i] + rows * width + -(-rows // per) * fixed
            if cost < best[j]:
                best[j], cut[j] = cost, i
    segments, j = [], len(widths)
    while j:
        segments.append((cut[j], j))
        j = cut[j]
    chunks: List[Tensor] = []
    for i, j in reversed(segments):
        rows = starts[j] - starts[i]
        chunks += torch.tensor_split(order[starts[i] : starts[j]], -(-rows // per_pass(widths[j - 1])))
    return chunks


def replace_input_ids(batch: Batch, where: Tensor, token_id: int) -> Dict[str, Any]:
    """A copy of ``batch`` whose ``input_ids`` are ``token_id`` where ``where`` is True (masks unchanged)."""
    if "input_ids" not in batch:
        raise KeyError(
            "This needs batch['input_ids'] (the pad baseline / pad occlusion embeds pad ids); "
            "use baseline='zero' or mode='delete' for models whose batches have no 'input_ids'."
        )
    out = dict(batch)
    out["input_ids"] = batch["input_ids"].masked_fill(where.to(batch["input_ids"].device), token_id)
    return out


def pad_embeddings(
    model: ExplainableModel, batch: Batch, embeddings: Tensor, *, pad_token_id: int | None = None
) -> Tensor:
    """``embeddings`` with every real token's vector replaced by the pad token's embedding.

    Positions that are not real tokens (pads, ``<sos>``/``<eos>``, ``[CLS]``) keep their own embedding, so a
    path from this baseline to ``embeddings`` only moves the tokens that are attributed. The pad id is
    ``pad_token_id``, else the model's ``pad_token_id`` attribute, else 0.
    """
    if pad_token_id is None:
        pad_token_id = getattr(model, "pad_token_id", None)
        pad_token_id = 0 if pad_token_id is None else int(pad_token_id)
    mask = model.token_mask(batch)
    with torch.no_grad():
        pads = model.embed(replace_input_ids(batch, mask, pad_token_id)).to(embeddings.dtype)
    return torch.where(mask.unsqueeze(-1), pads, embeddings)

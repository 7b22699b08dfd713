"""Cheap checks at the protocol boundary: token ids inside the vocabulary, attention a distribution over real tokens.

A model that breaks the :class:`~lightning_xai.adapters.ExplainableModel` contract rarely crashes: an attention
that sums to 5 gives an impermissible mass of 1.47, an id past the embedding table a bare ``IndexError``. These
functions turn such inputs into one clear error naming the problem and the fix. They cost one reduction over the
batch; callers run them where they cost nothing (:func:`check_logits` once, on the first audited batch; once per call of :func:`~lightning_xai.attribution.attribute`'s
``"attention"``, on the first audit batch, in the models' ``embed``).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, cast

import torch
from torch import Tensor, nn

from lightning_xai.adapters.capabilities import ReferenceLogits
from lightning_xai.adapters.protocol import Batch, ExplainableModel

__all__ = [
    "ATTENTION_ATOL",
    "LOGITS_RTOL",
    "check_attention_distribution",
    "check_attention_mask",
    "check_logits",
    "check_sequence_length",
    "check_token_ids",
    "evaluating",
    "vocabulary_size",
]

#: how far (absolute) a row's attention may sum from 1 over its real tokens, and leak onto other positions
ATTENTION_ATOL = 1e-3
#: how far an adapter's logits may be from its model's own, relative to the logits' scale (at least 1)
LOGITS_RTOL = 1e-4


def check_token_ids(ids: Tensor, vocab_size: int, source: str = "input_ids") -> None:
    """Raise a ValueError unless every id of ``ids`` indexes a row of a ``vocab_size``-row embedding table.

    Args:
        ids: integer tensor of token ids (any shape).
        vocab_size: rows of the embedding table.
        source: how the message names the model.

    Example:
        >>> check_token_ids(torch.tensor([[3, 4], [7, 0]]), 50)
        >>> check_token_ids(torch.tensor([[3, 60]]), 50)
        Traceback (most recent call last):
        ...
        ValueError: input_ids contain id 60 but the embedding table has 50 rows (valid ids 0..49): the batch was encoded with another vocabulary than the model's. Encode it with the model's vocabulary (the data module the model was built with: vocab_size=dm.vocab_size, or the checkpoint's tokenizer).
    """
    outside = (ids < 0) | (ids >= vocab_size)
    if not bool(outside.any()):  # one reduction, one sync
        return
    bad = int(ids[outside][0])
    raise ValueError(
        f"{source} contain id {bad} but the embedding table has {vocab_size} rows (valid ids "
        f"0..{vocab_size - 1}): the batch was encoded with another vocabulary than the model's. "
        "Encode it with the model's vocabulary (the data module the model was built with: "
        "vocab_size=dm.vocab_size, or the checkpoint's tokenizer)."
    )


def check_attention_mask(attention_mask: Any, input_ids: Tensor, mask: Any = None) -> None:
    """Raise a ValueError unless ``attention_mask`` (and the real-token ``mask``, when given) agree with ``input_ids``.

    The same ``[B, T]`` shape as ``input_ids``; every row attends to at least one position (a row of zeros has no
    input the model reads); and every real token of ``mask`` is a position the model attends to (a token the
    explanation calls real but the model never reads would get an attribution for nothing). Costs one reduction.

    Example:
        >>> ids = torch.tensor([[2, 7, 3], [2, 8, 3]])
        >>> check_attention_mask(torch.ones(2, 3, dtype=torch.long), ids)
        >>> check_attention_mask(torch.ones(2, 4, dtype=torch.long), ids)
        Traceback (most recent call last):
        ...
        ValueError: batch['attention_mask'] has shape (2, 4) but batch['input_ids'] has (2, 3): they must be the same [B, T] (one 0/1 per input id). Collate both from one tokenizer call (lightning_xai.data.hf.WordPieceCollator), and slice/pad them together.
        >>> check_attention_mask(torch.tensor([[1, 1, 1], [0, 0, 0]]), ids)
        Traceback (most recent call last):
        ...
        ValueError: batch['attention_mask'] is all 0 on rows [1]: the model reads no position of them, so their output and any explanation of them mean nothing. Drop empty rows before batching, or fix the attention_mask (1 at every non-pad position, special tokens included).
    """
    if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"batch['attention_mask'] has shape {tuple(getattr(attention_mask, 'shape', ()))} but "
            f"batch['input_ids'] has {tuple(input_ids.shape)}: they must be the same [B, T] (one 0/1 per "
            "input id). Collate both from one tokenizer call (lightning_xai.data.hf.WordPieceCollator), "
            "and slice/pad them together."
        )
    if mask is not None and (not isinstance(mask, Tensor) or tuple(mask.shape) != tuple(input_ids.shape)):
        raise ValueError(
            f"batch['mask'] has shape {tuple(getattr(mask, 'shape', ()))} but batch['input_ids'] has "
            f"{tuple(input_ids.shape)}: the real-token mask is [B, T], one bool per input id."
        )
    if attention_mask.numel() == 0:
        return
    attends = attention_mask != 0
    empty = ~attends.any(1)
    unread = (mask.to(attends.device) & ~attends).any(1) if mask is not None else torch.zeros_like(empty)
    if not bool((empty | unread).any()):  # one reduction, one sync
        return
    if bool(empty.any()):
        raise ValueError(
            f"batch['attention_mask'] is all 0 on rows {empty.nonzero().flatten().tolist()[:10]}: the "
            "model reads no position of them, so their output and any explanation of them mean nothing. "
            "Drop empty rows before batching, or fix the attention_mask (1 at every non-pad position, "
            "special tokens included)."
        )
    assert mask is not None  # without a mask nothing is unread: only empty rows fail, and they raised above
    row, position = (mask.to(attends.device) & ~attends).nonzero()[0].tolist()
    raise ValueError(
        f"batch['mask'] calls position {position} of row {row} a real token but batch['attention_mask'] "
        "is 0 there: the model does not read it, so its explanation would describe nothing. Build both "
        "masks from one tokenization (mask = attention_mask minus the special tokens)."
    )


def check_sequence_length(length: int, limit: Optional[int], offset: int = 0) -> None:
    """Raise a ValueError naming truncation when ``length`` positions do not fit ``limit`` position embeddings.

    ``offset``: the position ids a model skips before its first token (RoBERTa-style embeddings number positions
    from ``padding_idx + 1``, so ``max_position_embeddings=514`` holds 512 tokens).

    Example:
        >>> check_sequence_length(64, 66, offset=2)
        >>> check_sequence_length(65, 66, offset=2)
        Traceback (most recent call last):
        ...
        ValueError: Sequences of 65 word-pieces exceed the model's max length 64 (max_position_embeddings=66 less the 2 position ids its embeddings skip, padding_idx + 1); tokenize with truncation=True, max_length=64 (WordPieceCollator(max_length=...) truncates with a warning that counts the rationale/impermissible words cut off).
    """
    if limit is None:
        return
    usable = int(limit) - int(offset)
    if length <= usable:
        return
    why = (
        f" (max_position_embeddings={limit} less the {offset} position ids its embeddings skip, padding_idx + 1)"
        if offset
        else ""
    )
    raise ValueError(
        f"Sequences of {length} word-pieces exceed the model's max length {usable}{why}; tokenize with "
        f"truncation=True, max_length={usable} (WordPieceCollator(max_length=...) truncates with a "
        "warning that counts the rationale/impermissible words cut off)."
    )


def vocabulary_size(model: Any) -> Optional[int]:
    """Rows of ``model``'s input embedding table, or ``None`` when the model does not say.

    Asked in this order: ``embedding_table()`` (the EmbeddingShift capability), ``get_input_embeddings()``
    (``transformers`` models and adapters), ``config.vocab_size``.

    Example:
        >>> from torch import nn
        >>> class Lookup(nn.Module):
        ...     def get_input_embeddings(self):
        ...         return nn.Embedding(30, 4)
        >>> vocabulary_size(Lookup()), vocabulary_size(nn.Linear(2, 2))
        (30, None)
    """
    table = getattr(model, "embedding_table", None)
    if callable(table):
        weight = table()
        if isinstance(weight, Tensor) and weight.dim() == 2:
            return int(weight.shape[0])
    embeddings = getattr(model, "get_input_embeddings", None)
    if callable(embeddings):
        module = embeddings()
        if isinstance(getattr(module, "num_embeddings", None), int):
            return int(module.num_embeddings)
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if isinstance(size, int) else None


def check_attention_distribution(
    attention: Tensor, mask: Tensor, *, atol: float = ATTENTION_ATOL, source: str = "ExplainOutput.attention"
) -> None:
    """Raise a ValueError unless ``attention`` ``[B, T]`` is a distribution over the real tokens of ``mask``.

    Every value finite and ``>= -tol``, each row summing to 1 within ``tol`` over the real tokens and to at most
    ``tol`` elsewhere, where ``tol = max(atol, 2·eps(dtype))`` (bf16 rounds a softmax by up to 2⁻⁸ a value). This is
    what the protocol promises and what every attention metric (impermissible mass, permutation and erasure
    audits, divergences) assumes: a model returning, say, 5× its attention would otherwise get an impermissible
    mass above 1 without a word.

    Args:
        attention: ``[B, T]`` the model's attention (``ExplainOutput.attention``).
        mask: ``[B, T]`` bool, True at real tokens (``model.token_mask(batch)``).
        atol: the tolerance for float32/float64 attention.
        source: how the message names the attention.

    Raises:
        ValueError: naming the first offending row, what is wrong and the fix.

    Example:
        >>> mask = torch.tensor([[True, True, False]])
        >>> check_attention_distribution(torch.tensor([[0.25, 0.75, 0.0]]), mask)
        >>> check_attention_distribution(torch.tensor([[1.25, 3.75, 0.0]]), mask)
        Traceback (most recent call last):
        ...
        ValueError: ExplainOutput.attention is not a distribution over the real tokens: row 0 sums to 5 over its real tokens (expected 1 within 0.001). The protocol's attention is softmax(scores) over the real tokens (token_mask), 0 elsewhere: return the normalised weights the model pools with (unnormalised scores go in attention_scores), renormalised over the real tokens if the model also attends to special tokens.
    """
    if not isinstance(attention, Tensor) or attention.dim() != 2 or tuple(attention.shape) != tuple(mask.shape):
        raise ValueError(
            f"{source} has shape {tuple(getattr(attention, 'shape', ()))} but the token mask is "
            f"{tuple(mask.shape)}; the protocol's attention is [B, T], one weight per position."
        )
    if attention.numel() == 0:
        return
    tol = max(float(atol), 2 * torch.finfo(attention.dtype).eps) if attention.is_floating_point() else float(atol)
    values = attention.detach().double()
    real = mask.to(device=values.device, dtype=torch.bool)
    finite = torch.isfinite(values).all(1)
    inside = values.masked_fill(~real, 0.0).sum(1)
    outside = values.masked_fill(real, 0.0).abs().sum(1)
    negative = values.amin(1) < -tol
    bad = ~finite | negative | ((inside - 1).abs() > tol) | (outside > tol)
    if not bool(bad.any()):
        return
    row = int(bad.nonzero()[0, 0])
    if not bool(finite[row]):
        problem = "has NaN or infinite values (the model's attention is not finite: check its weights and inputs)"
    elif bool(negative[row]):
        problem = f"has a negative weight {float(values[row].min()):.4g}"
    elif float(outside[row]) > tol:
        problem = f"puts mass {float(outside[row]):.4g} on positions outside the token mask (pads/special tokens)"
    else:
        problem = f"sums to {float(inside[row]):.4g} over its real tokens (expected 1 within {tol:.2g})"
    raise ValueError(
        f"{source} is not a distribution over the real tokens: row {row} {problem}. The protocol's "
        "attention is softmax(scores) over the real tokens (token_mask), 0 elsewhere: return the "
        "normalised weights the model pools with (unnormalised scores go in attention_scores), "
        "renormalised over the real tokens if the model also attends to special tokens."
    )


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """Inside the block every submodule of ``module`` is in eval mode; on exit each gets its own mode back.

    For checks and probes that must see the deterministic function (no dropout) of a model that may be training:
    eval mode draws no random numbers and updates no running statistics, so the training run is unchanged.

    Example:
        >>> net = nn.Sequential(nn.Dropout(0.5), nn.Linear(2, 2))
        >>> net[1].eval()
        Linear(in_features=2, out_features=2, bias=True)
        >>> with evaluating(net):
        ...     net.training, net[0].training
        (False, False)
        >>> net.training, net[0].training, net[1].training
        (True, True, False)
    """
    modes = [(m, m.training) for m in module.modules()]
    try:
        for m, _ in modes:
            m.training = False
        yield module
    finally:
        for m, mode in modes:
            m.training = mode


def check_logits(model: Any, batch: Batch, *, rtol: float = LOGITS_RTOL) -> Optional[float]:
    """Check that an adapter computes its user's model: its logits against the model's own on ``batch``.

    For a model with the :class:`~lightning_xai.adapters.capabilities.ReferenceLogits` capability (an adapter
    such as :class:`~lightning_xai.adapters.HuggingFaceAdapter`), runs both on ``batch`` in eval mode (each
    submodule's mode restored after; no gradient) and compares: an adapter that reads the wrong position, pads
    or token types explains another function than the one trained, and every explanation would be silently
    wrong. Callbacks call it once, on their first audited batch; it costs two forward passes.

    Args:
        model: the explainable model (anything else is its own reference: nothing to compare, returns ``None``).
        batch: a batch as the model takes it.
        rtol: the largest ``max |Δlogit|`` allowed, relative to ``max(1, max |logit|)``.

    Returns:
        ``max |Δlogit|`` on the batch, or ``None`` for a model without a reference.

    Raises:
        ValueError: naming both models, the gap, and the fix the adapter gives (NaN fails too).

    Example:
        >>> from torch import nn
        >>> class Off(nn.Module):
        ...     def embed(self, batch):
        ...         return batch["x"][..., None]
        ...     def forward_from_embeddings(self, embeddings, batch, *, attention_override=None):
        ...         return type("Out", (), {"logits": embeddings.sum(1) + 1})()
        ...     def reference_logits(self, batch):
        ...         return batch["x"].sum(1, keepdim=True)
        ...     def describe_reference(self):
        ...         return "Net", "Pass the offset the model was trained with."
        >>> check_logits(Off(), {"x": torch.tensor([[1.0, 2.0]])})
        Traceback (most recent call last):
        ...
        ValueError: Off's logits differ from Net's own by 1 on this batch (eval mode): the explanations would describe a different function. Pass the offset the model was trained with.
        >>> check_logits(nn.Linear(2, 2), {}) is None
        True
    """
    if not isinstance(model, ReferenceLogits) or not callable(getattr(model, "embed", None)):
        return None
    adapter = cast(ExplainableModel, model)  # ReferenceLogits is a capability of adapters (and it has an embed)
    context = evaluating(model) if isinstance(model, nn.Module) else contextlib.nullcontext()
    with context, torch.no_grad():
        own = model.reference_logits(batch)
        mine = adapter.forward_from_embeddings(adapter.embed(batch), batch).logits
    name, fix = model.describe_reference()
    if tuple(own.shape) != tuple(mine.shape):
        raise ValueError(
            f"{type(model).__name__}'s logits have shape {tuple(mine.shape)} but {name}'s own have "
            f"{tuple(own.shape)} on this batch: the explanations would describe a different function. "
            f"{fix}"
        )
    gap = float((own.double() - mine.double().to(own.device)).abs().max()) if own.numel() else 0.0
    if not gap <= rtol * max(1.0, float(own.abs().max()) if own.numel() else 1.0):  # NaN fails too
        raise ValueError(
            f"{type(model).__name__}'s logits differ from {name}'s own by {gap:.3g} on this batch "
            f"(eval mode): the explanations would describe a different function. {fix}"
        )
    return gap

"""A checked scorer of many ``attention_override`` variants of one batch's rows (decision flip's fast path).

:func:`override_scorer` returns the model's full pass over the batch and, where the model offers a faster way to
score overrides of its rows, a scorer ``(rows, override) -> logits`` that reuses what the override cannot change:

* a model with the :class:`~lightning_xai.adapters.capabilities.OverrideReplay` capability gives its own
  (:class:`~lightning_xai.adapters.HuggingFaceAdapter` replays every layer before the last);
* a model with the :class:`~lightning_xai.adapters.capabilities.LinearHead` capability is scored as
  ``head(Σ_t α_t h_t)`` from the pass's hidden states (the reference BiLSTM: the pooling and the head only).

Every scorer is checked before it is returned, against the pass it came with (the model's own attention, every
row) and against full passes with a changed attention (uniform over the real tokens, the first two rows); one that
differs (``torch.allclose`` with ``rtol=1e-4, atol=1e-5``) is dropped (``None``), so the caller re-runs the model
instead: a replay is never a silent wrong number. A scorer whose ``checked_logits`` is the pass's own logits tensor
was already compared with them on every row at these tolerances by the model (the packed scorer of
:mod:`~lightning_xai.adapters.huggingface.packing`): that comparison is not repeated, the full-pass one is.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import LinearHead, OverrideReplay, OverrideScorer
from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput
from lightning_xai.attribution.batching import gather_rows

__all__ = ["REPLAY_RTOL", "REPLAY_ATOL", "override_scorer"]

#: tolerances of the check a scorer must pass (``torch.allclose``) before it replaces full passes
REPLAY_RTOL, REPLAY_ATOL = 1e-4, 1e-5


def _linear_head_scorer(model: LinearHead, out: ExplainOutput, mask: Tensor) -> Optional[OverrideScorer]:
    hidden = out.hidden_states
    if not isinstance(hidden, Tensor) or hidden.dim() != 3 or hidden.shape[:2] != mask.shape:
        return None
    head = model.linear_head()
    alpha = out.attention
    # head(Σ_t α_t h_t) = Σ_t α_t (W h_t) + b: the hidden states projected once to [B, T, C], so a variant reads C
    # numbers per token instead of H
    projected = torch.nn.functional.linear(hidden, head.weight)
    bias = head.bias

    def scorer(rows: Tensor, override: Optional[Tensor]) -> Tensor:
        rows = rows.to(hidden.device)
        weights = alpha.index_select(0, rows) if override is None else override
        weights = weights.masked_fill(~mask.index_select(0, rows), 0.0).to(hidden.dtype)
        logits = torch.einsum("bt,btc->bc", weights, projected.index_select(0, rows))
        return logits if bias is None else logits + bias

    return scorer


def _close(fast: Tensor, full: Tensor) -> bool:
    return fast.shape == full.shape and bool(
        torch.allclose(fast.to(full.dtype), full, rtol=REPLAY_RTOL, atol=REPLAY_ATOL)
    )


def override_scorer(
    model: ExplainableModel, embeddings: Tensor, batch: Batch
) -> Tuple[ExplainOutput, Optional[OverrideScorer]]:
    """``(model.forward_from_embeddings(embeddings, batch), scorer or None)``.

    ``scorer(rows, override)`` gives the ``[N, C]`` logits of rows ``rows`` (``LongTensor[N]``) of the batch with
    ``attention_override=override`` (``[N, T]``), as full passes would, faster. ``None`` when the model has no fast
    way or its scorer failed the check (module docstring): then run ``forward_from_embeddings`` per override.
    Runs without gradients; call it inside :func:`~lightning_xai.attribution.explanation_context`.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> out, scorer = override_scorer(model, model.embed(batch), batch)
        >>> override = torch.tensor([[0.0, 0.5, 0.5]])
        >>> bool(torch.allclose(scorer(torch.tensor([0]), override), model(batch, attention_override=override).logits))
        True
    """
    with torch.no_grad():
        mask = model.token_mask(batch)
        if isinstance(model, OverrideReplay):
            out, scorer = model.override_replay(embeddings, batch)
        else:
            out = model.forward_from_embeddings(embeddings, batch)
            scorer = _linear_head_scorer(model, out, mask) if isinstance(model, LinearHead) else None
        if scorer is None:
            return out, None
        B = mask.shape[0]
        # a scorer already checked on every row of this very pass (at these tolerances or tighter) is not run again
        checked = getattr(scorer, "checked_logits", None) is out.logits
        if not checked and not _close(scorer(torch.arange(B, device=mask.device), None), out.logits):
            return out, None
        rows = torch.arange(min(B, 2), device=mask.device)
        real = mask.index_select(0, rows)
        uniform = real.to(out.attention.dtype) / real.sum(1, keepdim=True).clamp(min=1).to(out.attention.dtype)
        full = model.forward_from_embeddings(
            embeddings.index_select(0, rows), gather_rows(batch, rows, B), attention_override=uniform
        ).logits
        if not _close(scorer(rows, uniform), full):
            return out, None
    return out, scorer

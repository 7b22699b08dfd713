"""Kindermans et al. (2019), "The (un)reliability of saliency methods": the input-invariance check.

Every embedding is shifted by a constant vector ``c`` and the first layer's bias is compensated, so the shifted
model computes exactly the same function of the tokens; a method *passes* when its map is unchanged. The shift
and its compensation are the model's :class:`~lightning_xai.adapters.capabilities.EmbeddingShift` capability.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Tuple, Union

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import EmbeddingShift
from lightning_xai.adapters.protocol import Batch, as_explainable
from lightning_xai.attribution import explanation_context, predicted_class
from lightning_xai.audits.sanity_table import (
    MethodSpec,
    SanityTable,
    _copy_model,
    _maps,
    _relative_change,
    _slug,
    _specs,
)
from lightning_xai.metrics.functional.agreement import kendall_tau

__all__ = ["DEFAULT_INVARIANCE_METHODS", "input_invariance", "input_shift_refusal", "shifted_model"]

DEFAULT_INVARIANCE_METHODS: Tuple[MethodSpec, ...] = (
    "attention",
    "gradient",
    "grad_x_input",
    ("integrated_gradients (zero baseline)", "integrated_gradients", {"baseline": "zero", "n_steps": 32}),
    ("integrated_gradients (pad baseline)", "integrated_gradients", {"baseline": "pad", "n_steps": 32}),
    "leave_one_out",
    "lrp",
)


def _embedding_table(model: Any) -> Tensor:
    refusal = input_shift_refusal(model)
    if refusal is not None:
        raise ValueError(refusal)
    return model.embedding_table()


def input_shift_refusal(model: Any) -> Optional[str]:
    """Why the input-invariance check cannot run on ``model`` (``None``: it can), known before any copy is made:
    it lacks the :class:`~lightning_xai.adapters.capabilities.EmbeddingShift` capability, or its optional
    ``embedding_shift_refusal()`` names why its embeddings cannot be shifted with compensation.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> input_shift_refusal(AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4)) is None
        True
        >>> cnn = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4, encoder="cnn")
        >>> print(input_shift_refusal(cnn))  # doctest: +ELLIPSIS
        Cannot compensate an embedding shift in CNNEncoder: ... input is not a bias change there.
    """
    if not isinstance(model, EmbeddingShift):
        return (
            f"{type(model).__name__} does not implement the EmbeddingShift capability "
            "(lightning_xai.adapters.capabilities: embedding_table() and shift_embeddings(shift)); the "
            "input-invariance check shifts the model's embeddings and needs the model to compensate "
            "the shift. Supported: AttentionClassifier (encoder 'lstm', 'bilstm', 'ortho_lstm', "
            "'ortho_bilstm' or 'mlp') and HuggingFaceAdapter over models that add position or token-type "
            "embeddings to their word embeddings (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, GPT-2, ...)."
        )
    refusal = getattr(model, "embedding_shift_refusal", None)
    return refusal() if callable(refusal) else None


def shifted_model(model: Any, shift: Union[float, Tensor]) -> Any:
    """A copy of ``model`` whose embeddings are all shifted by ``shift`` and whose first layer compensates it.

    Every row of the embedding table (the pad row too, so a pad-token baseline moves with the inputs) gets
    ``+ shift``; the layer reading the embeddings gets ``b ← b − W shift``. The copy computes the same logits.
    The model itself does both (:class:`~lightning_xai.adapters.capabilities.EmbeddingShift`); this copies it.

    Args:
        model: a model with the :class:`~lightning_xai.adapters.capabilities.EmbeddingShift` capability.
        shift: a ``[E]`` vector, or a float used for every dimension.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> other = shifted_model(model, 0.5)
        >>> torch.allclose(other(batch).logits, model(batch).logits, atol=1e-5)
        True
        >>> torch.allclose(other.embed(batch), model.embed(batch) + 0.5)
        True
    """
    table = _embedding_table(model)
    dim = table.shape[1]
    vector = torch.full((dim,), float(shift)) if not isinstance(shift, Tensor) else shift.detach().flatten()
    if vector.shape != (dim,):
        raise ValueError(
            f"shift must be a float or a [{dim}] vector (the embedding size); got shape {tuple(vector.shape)}."
        )
    if not torch.isfinite(vector).all():
        raise ValueError("shift must be finite.")
    other = _copy_model(model)
    other.shift_embeddings(vector.to(table))
    return other


def input_invariance(
    model: Any,
    batch: Batch,
    methods: Iterable[MethodSpec] = DEFAULT_INVARIANCE_METHODS,
    shift: Optional[Union[float, Tensor]] = None,
    *,
    tolerance: float = 1e-3,
    seed: int = 0,
) -> SanityTable:
    """Kindermans et al.'s input-invariance check.

    Args:
        model: a model with the :class:`~lightning_xai.adapters.capabilities.EmbeddingShift` capability (see
            :func:`shifted_model`).
        batch: a batch dict.
        methods: names or ``(label, method, options)`` triples for :func:`~lightning_xai.attribution.attribute`.
        shift: the constant vector ``c`` (``[E]`` or a float); default: a fixed random vector (``seed``) with
            the embedding table's per-coordinate standard deviation, i.e. as large as the embeddings themselves.
        tolerance: a method passes when ``‖map' − map‖ / ‖map‖ ≤ tolerance`` over the real tokens.
        seed: seed of the default shift.

    Returns:
        rows ``method, passes, relative_change, max_abs_change, tau`` (mean per-example Kendall τ-b between
        the two maps), after a first row ``model (logits)`` showing that the shifted model is the same function.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> table = input_invariance(model, batch, ["gradient", "grad_x_input"])
        >>> table.row(method="gradient")["passes"], table.row(method="grad_x_input")["passes"]
        (True, False)
    """
    model = as_explainable(model)
    specs = _specs(methods)
    table = _embedding_table(model).detach()
    if shift is None:
        generator = torch.Generator().manual_seed(seed)
        scale = float(table[1:].std()) if table.shape[0] > 1 else 1.0
        shift = torch.randn(table.shape[1], generator=generator, dtype=torch.float64) * scale
    other = shifted_model(model, shift)
    mask = model.token_mask(batch)
    target = predicted_class(model, batch)
    with explanation_context(model, batch) as clean, torch.no_grad():
        logits = model.forward_from_embeddings(model.embed(clean), clean).logits
    with explanation_context(other, batch) as clean, torch.no_grad():
        logits_shifted = other.forward_from_embeddings(other.embed(clean), clean).logits
    logit_change = (logits_shifted - logits).abs().max().item()
    logit_rel = logit_change / max(logits.abs().max().item(), 1e-30)
    rows = [
        {
            "method": "model (logits)",
            "passes": logit_rel <= tolerance,
            "relative_change": logit_rel,
            "max_abs_change": logit_change,
            "tau": float("nan"),
        }
    ]
    before = _maps(model, batch, specs, target, skip_unsupported=True)
    after = _maps(other, batch, specs, target, skip_unsupported=True)
    per_example: Dict[str, Tensor] = {}
    for label, _, _ in specs:
        map_before, map_after = before[label], after[label]
        if map_before is None:
            continue
        assert map_after is not None  # the shifted copy has the model's class: LRP supports both or neither
        worst, relative, per_row = _relative_change(map_before, map_after, mask)
        tau = kendall_tau(map_before, map_after, mask)[0]
        rows.append(
            {
                "method": label,
                "passes": relative <= tolerance,
                "relative_change": relative,
                "max_abs_change": worst,
                "tau": float(tau.nanmean()) if (~tau.isnan()).any() else float("nan"),
            }
        )
        per_example[f"{_slug(label)}/relative_change"] = per_row.cpu()
        per_example[f"{_slug(label)}/passes"] = (per_row <= tolerance).double().cpu()
    notes = (
        f"Embeddings shifted by a constant vector (norm {float(torch.as_tensor(shift).norm()):.3g}); first-layer "
        f"bias compensated. A method passes when its map changes by at most {tolerance:g} (relative L2)."
    )
    return SanityTable("input_invariance", rows, notes, per_example=per_example)

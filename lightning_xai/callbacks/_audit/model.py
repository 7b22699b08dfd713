"""Which model an audit callback explains, which tokenizer gives its words, and whether the model gives what the
audit reads: no protocol asked of the LightningModule.

:class:`~lightning_xai.callbacks.AuditCallback` sees the LightningModule through a
:class:`~lightning_xai.adapters.resolve.ModelResolver`: the module itself when it is explainable, the one
``transformers`` sequence classifier (or explainable submodule) it holds, or the model named by the callback's
``model=`` (an attribute path or a callable ``pl_module -> model``). An adapter built on the way is cached in the
callback, never registered in the module, so the module's state_dict and checkpoints are the user's own. Words for
reports come from the callback's ``tokenizer=``, else a ``tokenizer`` attribute of the LightningModule or the
DataModule (:func:`~lightning_xai.adapters.resolve.find_tokenizer`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_xai.adapters.capabilities import head_kind_of, supports_attention_override
from lightning_xai.adapters.checks import check_logits
from lightning_xai.adapters.protocol import ExplainableModel, ProtocolError
from lightning_xai.adapters.resolve import ModelResolver, ModelSpec, find_tokenizer
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.attribution.heads import check_softmax_head
from lightning_xai.callbacks._audit.guard import audit_guard

__all__ = [
    "check_attention_override",
    "check_probe_output",
    "explainable_model",
    "model_resolver",
    "probe_model",
    "refuse_non_softmax",
    "refuse_regression_flips",
    "report_tokenizer",
]


def model_resolver(model: ModelSpec, tokenizer: Any, owner: str) -> ModelResolver:
    """The resolver of a callback's ``model=`` / ``tokenizer=``, or a :class:`MisconfigurationException`."""
    try:
        return ModelResolver(model, tokenizer, owner=owner)
    except TypeError as err:
        raise MisconfigurationException(str(err)) from err


def explainable_model(resolver: ModelResolver, pl_module: Any, owner: str) -> ExplainableModel:
    """The module seen through the protocol, or a :class:`MisconfigurationException` saying how to fix it.

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> net = BertForSequenceClassification(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
        ...                                                num_attention_heads=2, intermediate_size=8))
        >>> module = torch.nn.ModuleDict({"net": net})
        >>> explainable_model(model_resolver(None, None, "AttentionAudit"), module, "AttentionAudit").model is net
        True
        >>> try:
        ...     explainable_model(model_resolver("head", None, "AttentionAudit"), module, "AttentionAudit")
        ... except Exception as error:
        ...     print(type(error).__name__, str(error).split(": ")[-1])
        MisconfigurationException ModuleDict has no attribute path 'head' ('ModuleDict' object has no attribute 'head').
    """
    try:
        return resolver(pl_module)
    except ProtocolError as err:
        raise MisconfigurationException(f"{owner} cannot audit this model: {err}") from err


def check_attention_override(owner: str, model: ExplainableModel) -> None:
    """Refuse, naming the model, a model that declares it cannot take ``attention_override`` (for an audit that
    replaces attention; :func:`~lightning_xai.adapters.capabilities.supports_attention_override`)."""
    if not supports_attention_override(model):
        raise MisconfigurationException(
            f"{owner} replaces the model's attention (attention_override), which "
            f"{type(getattr(model, 'model', model)).__name__} does not support (it declares overridable=False: "
            "its attention is computed inside its own modeling file). Attention maps and every saliency method "
            "still work: use AttentionAudit, or ErasureAudit(decision_flip=False)."
        )


def refuse_non_softmax(owner: str, model: Any, measure: str) -> None:
    """At setup: refuse, naming ``owner``, a model whose head is not a softmax over classes, for an audit whose
    ``measure`` compares softmax output distributions
    (:func:`~lightning_xai.attribution.heads.check_softmax_head`).

    Example:
        >>> class Scorer(torch.nn.Module):
        ...     head_kind = "regression"
        >>> refuse_non_softmax("AttentionBaselines", Scorer(), "the permutation test")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionBaselines cannot audit this model: ...
    """
    try:
        check_softmax_head(model, measure)
    except ValueError as err:
        raise MisconfigurationException(f"{owner} cannot audit this model: {err}") from err


def refuse_regression_flips(owner: str, model: Any) -> None:
    """At setup: refuse decision flips (``decision_flip=True``) of a regression model, which makes no decision.

    Example:
        >>> class Scorer(torch.nn.Module):
        ...     head_kind = "regression"
        >>> refuse_regression_flips("ErasureAudit", Scorer())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: ErasureAudit(decision_flip=True) watches ...
    """
    if head_kind_of(model) == "regression":
        raise MisconfigurationException(
            f"{owner}(decision_flip=True) watches the model's decision, but "
            f"{type(getattr(model, 'model', model)).__name__} has a regression head (head_kind='regression'): its "
            "outputs are values, so no decision can flip. Pass decision_flip=False: comprehensiveness and "
            "sufficiency then measure the change of the output value."
        )


def probe_model(
    owner: str,
    model: ExplainableModel,
    pl_module: torch.nn.Module,
    batch: Dict[str, Any],
    predict: Callable[[ExplainableModel, Dict[str, Any]], Any],
    split: str,
) -> None:
    """Run the audit's prediction step on two rows of ``batch``, the model's own ``probe(batch)`` when it has one
    and :func:`~lightning_xai.adapters.checks.check_logits` (the adapter's logits against the user's model)
    (inside :func:`~lightning_xai.callbacks._audit.guard.audit_guard`), then :func:`check_probe_output`; any
    failure is a :class:`MisconfigurationException` naming the cause."""
    try:
        with audit_guard(pl_module):
            rows = model.token_mask(batch).shape[0]  # two examples show the shapes, without GBs of attention
            batch = gather_rows(batch, torch.arange(min(2, rows)), rows)
            out = predict(model, batch).output
            probe = getattr(model, "probe", None)
            if callable(probe):
                probe(batch)
            check_logits(model, batch)  # an adapter reading another position or pad explains another function
    except MisconfigurationException:
        raise
    except Exception as err:
        raise MisconfigurationException(
            f"{owner} cannot audit this model: its probe on the {split!r} split failed with {type(err).__name__}: {err}"
        ) from err
    check_probe_output(owner, out, model.token_mask(batch))


def check_probe_output(owner: str, out: Any, mask: Tensor) -> None:
    """Refuse a forward pass without a ``[B, T]`` attention matching ``mask`` or without ``[B, C]`` logits (a
    generator's output — one with ``target_log_probs`` — needs ``[B, K]`` ``target_log_probs`` and ``target_steps``).

    Example:
        >>> from types import SimpleNamespace
        >>> check_probe_output("AttentionAudit", SimpleNamespace(attention=None), torch.ones(2, 3, dtype=torch.bool))
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit needs the model's attention: ...
    """
    attention = getattr(out, "attention", None)
    if not isinstance(attention, Tensor) or attention.shape != mask.shape:
        shape = None if not isinstance(attention, Tensor) else tuple(attention.shape)
        raise MisconfigurationException(
            f"{owner} needs the model's attention: forward_from_embeddings must return an "
            f"ExplainOutput whose `attention` is a [B, T] tensor matching token_mask {tuple(mask.shape)}; got "
            f"{shape}. Models without an attention layer cannot be audited for attention faithfulness."
        )
    log_probs = getattr(out, "target_log_probs", None)
    if log_probs is not None:  # a generator (TargetSequence): the explained scores are its target log-probabilities
        steps = getattr(out, "target_steps", None)
        if (
            not isinstance(log_probs, Tensor)
            or log_probs.dim() != 2
            or log_probs.shape[0] != mask.shape[0]
            or not isinstance(steps, Tensor)
            or steps.shape != log_probs.shape
        ):
            raise MisconfigurationException(
                f"{owner} needs a generator's target_log_probs and target_steps as [B, K] tensors from "
                f"forward_from_embeddings; got {getattr(log_probs, 'shape', None)} and {getattr(steps, 'shape', None)}."
            )
        return
    logits = getattr(out, "logits", None)
    if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[0] != mask.shape[0]:
        raise MisconfigurationException(
            f"{owner} needs [B, C] logits from forward_from_embeddings (or, for a generator, target_log_probs: "
            "a transformers *ForCausalLM or encoder–decoder seen through HuggingFaceAdapter)."
        )


def report_tokenizer(resolver: Optional[ModelResolver], tokenizer: Any, trainer: Any, pl_module: Any) -> Any:
    """The tokenizer that gives an audited example's words: the callback's ``tokenizer``, else the module's or the
    DataModule's ``tokenizer`` attribute, else that of the adapter the module holds (or the callback built)."""
    datamodule = getattr(trainer, "datamodule", None)
    found = find_tokenizer(pl_module, tokenizer)
    if found is None:
        found = getattr(datamodule, "tokenizer", None)
    if found is None and resolver is not None:  # an adapter the module holds (or built here)
        try:
            found = getattr(resolver(pl_module), "tokenizer", None)
        except ProtocolError:
            found = None
    return found

"""Which model an audit callback explains, and which tokenizer gives its words: no protocol asked of the module.

:class:`ModelLookup` (mixed into :class:`~lightning_xai.callbacks.AuditCallback`) sees the LightningModule
through a :class:`~lightning_xai.adapters.resolve.ModelResolver`: the module itself when it is explainable, the
one ``transformers`` sequence classifier (or explainable submodule) it holds, or the model named by the
callback's ``model=`` (an attribute path or a callable ``pl_module -> model``). An adapter built on the way is
cached in the callback, never registered in the module, so the module's state_dict and checkpoints are the
user's own. Words for reports come from the callback's ``tokenizer=``, else a ``tokenizer`` attribute of the
LightningModule or the DataModule (:func:`~lightning_xai.adapters.resolve.find_tokenizer`).
"""
from __future__ import annotations

from typing import Any, List, Optional

from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.adapters.capabilities import supports_attention_override
from lightning_xai.adapters.protocol import ExplainableModel, ProtocolError
from lightning_xai.adapters.resolve import ModelResolver, ModelSpec, find_tokenizer
from lightning_xai.callbacks.results import AuditExample, example_tokens

__all__ = ["ModelLookup"]


class ModelLookup:
    """Mixin: ``explainable(pl_module)`` and ``example_tokens(trainer, pl_module, example)`` of an audit callback.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> from lightning_xai.callbacks import AttentionAudit
        >>> net = BertForSequenceClassification(BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1,
        ...                                                num_attention_heads=2, intermediate_size=8))
        >>> module = torch.nn.ModuleDict({"net": net})
        >>> AttentionAudit().explainable(module).model is net
        True
        >>> try:
        ...     AttentionAudit(model="head").explainable(module)
        ... except Exception as error:
        ...     print(type(error).__name__, str(error).split(": ")[-1])
        MisconfigurationException ModuleDict has no attribute path 'head' ('ModuleDict' object has no attribute 'head').
    """

    tokenizer: Any = None
    _resolver: Optional[ModelResolver] = None
    #: True for audits that replace the model's attention (``attention_override``): checked before the first audit.
    needs_attention_override: bool = False

    def init_lookup(self, model: ModelSpec, tokenizer: Any) -> None:
        """Set the model spec and tokenizer (called by ``__init__``; raises :class:`MisconfigurationException`)."""
        try:
            self._resolver = ModelResolver(model, tokenizer, owner=type(self).__name__)
        except TypeError as err:
            raise MisconfigurationException(str(err)) from err
        self.tokenizer = tokenizer

    def explainable(self, pl_module: Any) -> ExplainableModel:
        """The module seen through the protocol, or a :class:`MisconfigurationException` saying how to fix it."""
        if self._resolver is None:
            self._resolver = ModelResolver(owner=type(self).__name__)
        try:
            return self._resolver(pl_module)
        except ProtocolError as err:
            raise MisconfigurationException(f"{type(self).__name__} cannot audit this model: {err}") from err

    def check_attention_override(self, model: ExplainableModel) -> None:
        """Refuse, naming the model, a model that declares it cannot take ``attention_override`` when this audit
        replaces attention (:func:`~lightning_xai.adapters.capabilities.supports_attention_override`)."""
        if self.needs_attention_override and not supports_attention_override(model):
            raise MisconfigurationException(
                f"{type(self).__name__} replaces the model's attention (attention_override), which "
                f"{type(getattr(model, 'model', model)).__name__} does not support (it declares overridable=False: "
                "its attention is computed inside its own modeling file). Attention maps and every saliency method "
                "still work: use AttentionAudit, or ErasureAudit(decision_flip=False).")

    def example_tokens(self, trainer: Any, pl_module: Any, example: AuditExample) -> List[str]:
        """The words of an audited example (see :func:`~lightning_xai.callbacks.results.example_tokens`)."""
        datamodule = getattr(trainer, "datamodule", None)
        tokenizer = find_tokenizer(pl_module, self.tokenizer)
        if tokenizer is None:
            tokenizer = getattr(datamodule, "tokenizer", None)
        if tokenizer is None and self._resolver is not None:  # an adapter the module holds (or built here)
            try:
                tokenizer = getattr(self._resolver(pl_module), "tokenizer", None)
            except ProtocolError:
                tokenizer = None
        return example_tokens(trainer, pl_module, example, tokenizer=tokenizer)

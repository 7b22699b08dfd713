"""Find the explainable model inside a user's LightningModule, with no protocol asked of the module.

A LightningModule is seen by the audits and losses as:

1. itself, when it implements :class:`~lightning_xai.adapters.ExplainableModel`;
2. the model named explicitly: an attribute path (``"backbone.classifier"``), an ``nn.Module``, or a callable
   ``pl_module -> model``;
3. otherwise the one explainable submodule or ``transformers`` sequence classifier it holds (searched
   top-down; a classifier inside an explainable adapter counts once). None, or several, is an error naming them.

A ``transformers`` sequence classifier (a ``PreTrainedModel`` whose class is one of transformers'
``*ForSequenceClassification`` models) is wrapped in a :class:`~lightning_xai.adapters.HuggingFaceAdapter`
built with the tokenizer :func:`find_tokenizer` finds. The adapter lives in the :class:`ModelResolver` (the
callback's or loss's), never in the LightningModule: no duplicate state_dict keys, and checkpoints load in code
that has never heard of lightning_xai.
"""
from __future__ import annotations

import operator
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from torch import nn

from lightning_xai.adapters.huggingface import HuggingFaceAdapter
from lightning_xai.adapters.protocol import ExplainableModel, ProtocolError, as_explainable

__all__ = ["ModelResolver", "ModelSpec", "explainable_model", "find_tokenizer", "is_sequence_classifier"]

#: how a model is named explicitly: an attribute path, the module itself, or ``pl_module -> model``
ModelSpec = Union[None, str, nn.Module, Callable[[Any], Any]]

_RECIPE = ("name it: model='<attribute path>' (e.g. model='model') or model=lambda module: "
           "HuggingFaceAdapter(module.net) / HookAdapter(module.net, embedding=..., attention=...)")


def is_sequence_classifier(module: Any) -> bool:
    """Whether ``module`` is a ``transformers`` sequence classifier (``*ForSequenceClassification``).

    Example:
        >>> from transformers import BertConfig, BertForSequenceClassification, BertModel
        >>> config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                     intermediate_size=8)
        >>> is_sequence_classifier(BertForSequenceClassification(config)), is_sequence_classifier(BertModel(config))
        (True, False)
    """
    transformers = sys.modules.get("transformers")  # a module holding one has imported transformers already
    pretrained = getattr(transformers, "PreTrainedModel", None) if transformers is not None else None
    if pretrained is None or not isinstance(module, pretrained):
        return False
    return any(cls.__name__.endswith("ForSequenceClassification") for cls in type(module).__mro__)


def find_tokenizer(holder: Any, tokenizer: Any = None) -> Any:
    """The tokenizer to use: ``tokenizer`` if given, else ``holder.tokenizer``, else the ``tokenizer`` of the
    DataModule of the trainer ``holder`` is attached to (``None`` when there is none).

    Example:
        >>> class Module:
        ...     tokenizer = "the module's"
        >>> find_tokenizer(Module()), find_tokenizer(Module(), "given")
        ("the module's", 'given')
    """
    if tokenizer is not None:
        return tokenizer
    own = getattr(holder, "tokenizer", None)
    if own is not None:
        return own
    trainer = getattr(holder, "_trainer", None)
    return getattr(getattr(trainer, "datamodule", None), "tokenizer", None)


def _candidates(module: nn.Module, prefix: str = "") -> List[Tuple[str, nn.Module]]:
    found: List[Tuple[str, nn.Module]] = []
    for name, child in module.named_children():
        path = f"{prefix}{name}"
        if isinstance(child, ExplainableModel) or is_sequence_classifier(child):
            found.append((path, child))
        else:
            found.extend(_candidates(child, f"{path}."))
    return found


class ModelResolver:
    """Sees a LightningModule (or any holder) as an :class:`ExplainableModel`; caches the adapters it builds.

    Args:
        model: ``None`` (find it, see the module docstring), an attribute path, an ``nn.Module`` or a callable
            ``holder -> model`` (called once per holder).
        tokenizer: the tokenizer for adapters built here (default: :func:`find_tokenizer`).
        owner: the name used in error messages.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> config = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                     intermediate_size=8)
        >>> class Module(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = BertForSequenceClassification(config)
        >>> module, resolve = Module(), ModelResolver()
        >>> model = resolve(module)
        >>> type(model).__name__, model.model is module.net, resolve(module) is model
        ('HuggingFaceAdapter', True, True)
        >>> any(key.startswith("adapter") for key in module.state_dict())
        False
    """

    def __init__(self, model: ModelSpec = None, tokenizer: Any = None, owner: str = "lightning_xai") -> None:
        if model is not None and not isinstance(model, (str, nn.Module)) and not callable(model):
            raise TypeError(f"{owner}(model) must be None, an attribute path, an nn.Module or a callable "
                            f"pl_module -> model; got {type(model).__name__}.")
        self.model = model
        self.tokenizer = tokenizer
        self.owner = owner
        self._adapters: Dict[int, HuggingFaceAdapter] = {}
        self._called: Optional[Tuple[Any, Any]] = None  # (holder, result) of a callable spec

    def __call__(self, holder: Any) -> ExplainableModel:
        """The explainable model of ``holder`` (raises :class:`ProtocolError` saying how to name it)."""
        return self._explainable(self._target(holder), holder)

    def _target(self, holder: Any) -> Any:
        spec = self.model
        if isinstance(spec, nn.Module):
            return spec
        if isinstance(spec, str):
            try:
                return operator.attrgetter(spec)(holder)
            except AttributeError as err:
                raise ProtocolError(f"{self.owner}(model={spec!r}): {type(holder).__name__} has no attribute "
                                    f"path {spec!r} ({err}).") from err
        if spec is not None:
            if self._called is None or self._called[0] is not holder:
                self._called = (holder, spec(holder))
            return self._called[1]
        if isinstance(holder, ExplainableModel) or is_sequence_classifier(holder) or not isinstance(holder, nn.Module):
            return holder
        found = _candidates(holder)
        if len(found) == 1:
            return found[0][1]
        if not found:
            try:
                as_explainable(holder)
            except ProtocolError as err:
                raise ProtocolError(f"{err} It holds no explainable submodule or transformers sequence classifier "
                                    f"either; {_RECIPE}.") from err
        what = ", ".join(f"{path} ({type(m).__name__})" for path, m in found)
        raise ProtocolError(
            f"{self.owner} cannot tell which model of {type(holder).__name__} to explain: it is not an "
            f"ExplainableModel itself and holds several explainable models or transformers sequence classifiers "
            f"({what}); {_RECIPE}.")

    def _explainable(self, target: Any, holder: Any) -> ExplainableModel:
        if isinstance(target, ExplainableModel):
            return target
        if is_sequence_classifier(target):
            adapter = self._adapters.get(id(target))
            if adapter is None or adapter.model is not target:
                try:
                    adapter = HuggingFaceAdapter(target, tokenizer=find_tokenizer(holder, self.tokenizer))
                except ValueError as err:
                    raise ProtocolError(f"{self.owner}: {err}") from err
                self._adapters = {id(target): adapter}
            return adapter
        try:
            return as_explainable(target)
        except ProtocolError as err:
            raise ProtocolError(f"{self.owner}: {err} Or {_RECIPE}.") from err


#: one resolver per holder, kept outside it (the adapter it builds never joins the holder's state_dict); an entry
#: goes when its holder does
_RESOLVERS: "weakref.WeakKeyDictionary[nn.Module, ModelResolver]" = weakref.WeakKeyDictionary()


def explainable_model(holder: Any, owner: str = "lightning_xai") -> ExplainableModel:
    """The explainable model of ``holder`` (found as :class:`ModelResolver` does), the same object on every call.

    What a LightningModule that merely holds its model uses to get explainable outputs for a loss, e.g.
    ``outputs = explainable_model(self)(batch)`` then ``loss(outputs, batch, model=self)``. Anything that is
    not an ``nn.Module`` is returned as it is.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> holder = torch.nn.ModuleDict({"net": BertForSequenceClassification(BertConfig(
        ...     vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8))})
        >>> model = explainable_model(holder)
        >>> model.model is holder["net"], model is explainable_model(holder), sorted(holder.state_dict())[0]
        (True, True, 'net.bert.embeddings.LayerNorm.bias')
    """
    if isinstance(holder, ExplainableModel) or not isinstance(holder, nn.Module):
        return holder
    resolver = _RESOLVERS.get(holder)
    if resolver is None:
        resolver = _RESOLVERS[holder] = ModelResolver(owner=owner)
    return resolver(holder)

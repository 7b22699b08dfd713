"""Find the explainable model inside a user's LightningModule, with no protocol asked of the module.

A LightningModule is seen by the audits and losses as:

1. itself, when it implements :class:`~lightning_xai.adapters.ExplainableModel`;
2. the model named explicitly: an attribute path (``"backbone.classifier"``), an ``nn.Module``, or a callable
   ``pl_module -> model``; or a mapping ``{"model": <one of those, or None>, **adapter options}`` that also carries
   options for the adapter built on the way (``{"model": "net", "query_index": 0}``, ``{"attention": "rollout"}``);
3. otherwise the one explainable submodule, ``transformers`` sequence classifier or generator it holds (searched
   top-down; a classifier inside an explainable adapter counts once). None, or several, is an error naming them.

A ``transformers`` sequence classifier (a ``PreTrainedModel`` whose class is one of transformers'
``*ForSequenceClassification`` models), bare or wrapped (PEFT, ``torch.compile``, DDP/FSDP:
:mod:`~lightning_xai.adapters.huggingface.unwrap`), is wrapped in a :class:`~lightning_xai.adapters.HuggingFaceAdapter`
built with the tokenizer :func:`find_tokenizer` finds; so is a ``transformers`` model that generates (a causal LM,
an encoder–decoder: :func:`~lightning_xai.adapters.huggingface.is_generator`), for which the adapter is a
:class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`, and the adapter options given (:data:`ADAPTER_OPTIONS`). The adapter lives in the :class:`ModelResolver` (the
callback's or loss's), never in the LightningModule: no duplicate state_dict keys, and checkpoints load in code
that has never heard of lightning_xai.
"""

from __future__ import annotations

import difflib
import inspect
import operator
import sys
import weakref
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from torch import nn

from lightning_xai.adapters.huggingface import HuggingFaceAdapter, is_generator
from lightning_xai.adapters.huggingface.unwrap import unwrap
from lightning_xai.adapters.protocol import ExplainableModel, ProtocolError, as_explainable

__all__ = [
    "ADAPTER_OPTIONS",
    "ModelResolver",
    "ModelSpec",
    "explainable_model",
    "find_tokenizer",
    "is_sequence_classifier",
    "split_spec",
]

#: how a model is named explicitly: an attribute path, the module itself, ``pl_module -> model``, or a mapping
#: ``{"model": <one of those or None>, **adapter options}``
ModelSpec = Union[None, str, nn.Module, Callable[[Any], Any], Mapping[str, Any]]

#: the options a resolver passes to the :class:`~lightning_xai.adapters.HuggingFaceAdapter` it builds
ADAPTER_OPTIONS = tuple(
    name
    for name in inspect.signature(HuggingFaceAdapter.__init__).parameters
    if name not in ("self", "model", "tokenizer")
)


def split_spec(
    spec: ModelSpec, options: Optional[Mapping[str, Any]] = None, owner: str = "lightning_xai"
) -> Tuple[Any, Dict[str, Any]]:
    """``(model spec, adapter options)`` of a spec that may be a mapping carrying options; ``options`` add to them.

    Raises:
        TypeError: an option :class:`~lightning_xai.adapters.HuggingFaceAdapter` does not take (the close match
            named), or an option given twice.

    Example:
        >>> split_spec({"model": "net", "query_index": 0})
        ('net', {'query_index': 0})
        >>> split_spec({"query_idx": 0})
        Traceback (most recent call last):
        ...
        TypeError: lightning_xai(model=...): unknown adapter option 'query_idx' (did you mean 'query_index'?); the options are attention, override_specials, query_index, check.
    """
    found: Dict[str, Any] = {}
    if isinstance(spec, Mapping):
        found = {k: v for k, v in spec.items() if k != "model"}
        spec = spec.get("model")
    for key, value in (options or {}).items():
        if key in found:
            raise TypeError(f"{owner}(model=...): adapter option {key!r} is given twice.")
        found[key] = value
    for key in found:
        if key not in ADAPTER_OPTIONS:
            close = difflib.get_close_matches(str(key), ADAPTER_OPTIONS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(
                f"{owner}(model=...): unknown adapter option {key!r}{hint}; the options are "
                f"{', '.join(ADAPTER_OPTIONS)}."
            )
    return spec, found


_RECIPE = (
    "name it: model='<attribute path>' (e.g. model='model') or model=lambda module: "
    "HuggingFaceAdapter(module.net) / HookAdapter(module.net, embedding=..., attention=...)"
)


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
    if pretrained is None or not isinstance(module, nn.Module):
        return False
    try:
        module = unwrap(module).model
    except ProtocolError:  # a PEFT model the adapter refuses by name: still the classifier to explain
        module = module.get_base_model()
    if pretrained is None or not isinstance(module, pretrained):
        return False
    return any(cls.__name__.endswith("ForSequenceClassification") for cls in type(module).__mro__)


def _explained_transformer(module: Any) -> bool:
    """A ``transformers`` model the resolver wraps in an adapter: a sequence classifier or a generator."""
    return is_sequence_classifier(module) or is_generator(module)


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
        if isinstance(child, ExplainableModel) or _explained_transformer(child):
            found.append((path, child))
        else:
            found.extend(_candidates(child, f"{path}."))
    return found


class ModelResolver:
    """Sees a LightningModule (or any holder) as an :class:`ExplainableModel`; caches the adapters it builds.

    Args:
        model: ``None`` (find it, see the module docstring), an attribute path, an ``nn.Module``, a callable
            ``holder -> model`` (called once per holder), or a mapping ``{"model": <one of those>, **options}``.
        tokenizer: the tokenizer for adapters built here (default: :func:`find_tokenizer`).
        owner: the name used in error messages.
        options: options of the adapters built here (:data:`ADAPTER_OPTIONS`, e.g. ``query_index``); with those
            of a mapping ``model``.

    Raises:
        TypeError: a spec of another type, or an unknown adapter option.

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

    def __init__(
        self,
        model: ModelSpec = None,
        tokenizer: Any = None,
        owner: str = "lightning_xai",
        options: Optional[Mapping[str, Any]] = None,
    ) -> None:
        model, self.options = split_spec(model, options, owner)
        if model is not None and not isinstance(model, (str, nn.Module)) and not callable(model):
            raise TypeError(
                f"{owner}(model) must be None, an attribute path, an nn.Module, a callable "
                f"pl_module -> model or a mapping {{'model': ..., **adapter options}}; got "
                f"{type(model).__name__}."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.owner = owner
        self._adapters: Dict[int, Tuple[Any, HuggingFaceAdapter]] = {}
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
                raise ProtocolError(
                    f"{self.owner}(model={spec!r}): {type(holder).__name__} has no attribute path {spec!r} ({err})."
                ) from err
        if spec is not None:
            if self._called is None or self._called[0] is not holder:
                self._called = (holder, spec(holder))
            return self._called[1]
        if isinstance(holder, ExplainableModel) or _explained_transformer(holder) or not isinstance(holder, nn.Module):
            return holder
        found = _candidates(holder)
        if len(found) == 1:
            return found[0][1]
        if not found:
            try:
                as_explainable(holder)
            except ProtocolError as err:
                raise ProtocolError(
                    f"{err} It holds no explainable submodule or transformers sequence classifier either; {_RECIPE}."
                ) from err
        what = ", ".join(f"{path} ({type(m).__name__})" for path, m in found)
        raise ProtocolError(
            f"{self.owner} cannot tell which model of {type(holder).__name__} to explain: it is not an "
            f"ExplainableModel itself and holds several explainable models or transformers sequence classifiers "
            f"({what}); {_RECIPE}."
        )

    def _explainable(self, target: Any, holder: Any) -> ExplainableModel:
        if isinstance(target, ExplainableModel):
            if self.options:
                raise ProtocolError(
                    f"{self.owner}: the adapter options {sorted(self.options)} apply to the HuggingFaceAdapter built "
                    f"for a transformers classifier, but {type(target).__name__} is explainable itself; give them "
                    "to its own constructor instead."
                )
            return target
        if _explained_transformer(target):
            given, adapter = self._adapters.get(id(target), (None, None))
            if adapter is None or given is not target:
                try:
                    adapter = HuggingFaceAdapter(
                        target, tokenizer=find_tokenizer(holder, self.tokenizer), **self.options
                    )
                except ValueError as err:
                    raise ProtocolError(f"{self.owner}: {err}") from err
                self._adapters = {id(target): (target, adapter)}
            return adapter
        try:
            return as_explainable(target)
        except ProtocolError as err:
            raise ProtocolError(f"{self.owner}: {err} Or {_RECIPE}.") from err


#: one resolver per holder, kept outside it (the adapter it builds never joins the holder's state_dict); an entry
#: goes when its holder does
_RESOLVERS: "weakref.WeakKeyDictionary[nn.Module, ModelResolver]" = weakref.WeakKeyDictionary()


def explainable_model(holder: Any, owner: str = "lightning_xai", **options: Any) -> ExplainableModel:
    """The explainable model of ``holder`` (found as :class:`ModelResolver` does), the same object on every call.

    What a LightningModule that merely holds its model uses to get explainable outputs for a loss, e.g.
    ``outputs = explainable_model(self)(batch)`` then ``loss(outputs, batch, model=self)``. Anything that is
    not an ``nn.Module`` is returned as it is. ``options`` go to the adapter built for a ``transformers``
    classifier (:data:`ADAPTER_OPTIONS`: ``explainable_model(self, query_index=0)``); other options than the
    previous call's build a new adapter.

    Raises:
        TypeError: an unknown adapter option (the close match named).

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
    if resolver is None or resolver.options != split_spec(None, options, owner)[1]:
        resolver = _RESOLVERS[holder] = ModelResolver(owner=owner, options=options)
    return resolver(holder)

"""The registry of attribution methods: one record per method name, carrying the facts its callers need.

A method's facts are declared once, where it is registered, and read from its :class:`MethodRecord` by
:func:`~lightning_xai.attribution.attribute` (does it resolve its own target? does its result have the declared
shape?) and by the audit callbacks (compute it in float32 under reduced precision? does it give pairwise
interactions for the report?) — no caller keeps a table of method names of its own.

A module that registers methods is imported by :mod:`lightning_xai.attribution`'s ``__init__`` (statically, so
the import contracts see it), and importing any part of the package registers every built-in method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Tuple, Union

from torch import Tensor

__all__ = [
    "ATTRIBUTION_METHODS",
    "AttributionFn",
    "MethodRecord",
    "PAIRWISE_INTERACTIONS",
    "RETURNS",
    "SCORES",
    "SCORES_AND_DELTA",
    "method_record",
    "register_method",
]

AttributionFn = Callable[..., Union[Tensor, Tuple[Tensor, ...]]]

#: only the ``[B, T]`` map
SCORES = "scores"
#: the ``[B, T]`` map, or ``(map, delta [B])`` when called with ``return_convergence_delta=True`` (Captum's
#: ``has_convergence_delta``: a completeness/conservation error per row)
SCORES_AND_DELTA = "scores_and_delta"
#: always a tuple ``(map [B, T], interactions [B, T, T])`` — token-pair interactions whose row sums are the map —
#: with ``delta`` appended when called with ``return_convergence_delta=True``
PAIRWISE_INTERACTIONS = "pairwise_interactions"
#: the values of :attr:`MethodRecord.returns`
RETURNS = (SCORES, SCORES_AND_DELTA, PAIRWISE_INTERACTIONS)


@dataclass(frozen=True)
class MethodRecord:
    """What the package knows about one registered attribution method.

    Attributes:
        name: the name ``attribute(..., method=name)`` accepts.
        function: ``fn(model, batch, target, *, create_graph, **options)`` (see :func:`register_method`).
        resolves_target: the function receives the caller's raw ``target`` and resolves it itself (saving
            :func:`~lightning_xai.attribution.attribute` a forward pass).
        precision_sensitive: its maps change beyond the noise in bfloat16/float16 (leave-one-out: per-sentence τ
            with the float32 map of median 0.66 under bf16 autocast; gradient and grad×input stay ≥ 0.96), so the
            audit callbacks compute them in float32 with ``precision="auto"``.
        returns: the shape of the result, one of :data:`RETURNS` (:data:`SCORES`, :data:`SCORES_AND_DELTA`,
            :data:`PAIRWISE_INTERACTIONS`).
        unshardable: why the method cannot explain a model sharded with FSDP2 (``fully_shard``, Lightning's
            ``ModelParallelStrategy``), which the audit callbacks then refuse before the first audit; ``""``: it can
            (:mod:`lightning_xai.adapters.sharding`).

    Example:
        >>> from lightning_xai.attribution import method_record
        >>> record = method_record("integrated_gradients")
        >>> record.precision_sensitive, record.returns, record.has_convergence_delta
        (True, 'scores_and_delta', True)
        >>> method_record("gradient").has_interactions
        False
    """

    name: str
    function: AttributionFn
    resolves_target: bool = False
    precision_sensitive: bool = False
    returns: str = SCORES
    unshardable: str = ""

    @property
    def has_convergence_delta(self) -> bool:
        """Whether ``return_convergence_delta=True`` adds a per-row completeness error to the result."""
        return self.returns != SCORES

    @property
    def has_interactions(self) -> bool:
        """Whether the result's second element is a ``[B, T, T]`` matrix of token-pair interactions."""
        return self.returns == PAIRWISE_INTERACTIONS


#: name -> :class:`MethodRecord`. Add entries with :func:`register_method`.
ATTRIBUTION_METHODS: Dict[str, MethodRecord] = {}


def register_method(
    name: str,
    *,
    resolves_target: bool = False,
    precision_sensitive: bool = False,
    returns: str = SCORES,
    unshardable: str = "",
) -> Callable[[AttributionFn], AttributionFn]:
    """Register an attribution function under ``name`` so ``attribute(..., method=name)`` finds it.

    The function is called as ``fn(model, batch, target, *, create_graph, **options)`` inside
    :func:`~lightning_xai.attribution.explanation_context` (grad enabled, model in eval mode, parameters frozen
    unless ``create_graph``), with a batch whose inference tensors were cloned and whose rows all have a real token.
    ``target`` is a validated ``LongTensor[B]`` — unless ``resolves_target=True``, in which case the function
    receives the caller's raw ``target`` (``None``/int/tensor) and must call
    :func:`~lightning_xai.attribution.resolve_target` on the logits it computes anyway (this saves a forward pass).
    It returns what ``returns`` declares (a ``[B, T]`` map, or a tuple whose first element is the map);
    :func:`~lightning_xai.attribution.attribute` checks that, zeroes non-tokens and applies ``normalize``.

    Args:
        name: the method's string name; re-registering a name replaces its record.
        resolves_target: see above.
        precision_sensitive: its maps change beyond the noise in reduced precision; the audit callbacks compute
            them in float32 (see :class:`MethodRecord`).
        returns: :data:`SCORES` (default), :data:`SCORES_AND_DELTA` or :data:`PAIRWISE_INTERACTIONS`.
        unshardable: why it cannot explain a model sharded with FSDP2 (see :class:`MethodRecord`); ``""``: it can.

    Raises:
        ValueError: an empty name, or ``returns`` not in :data:`RETURNS`.

    Example:
        >>> import torch
        >>> @register_method("constant_one")
        ... def constant_one(model, batch, target, *, create_graph=False):
        ...     return torch.ones(model.token_mask(batch).shape)
        >>> ATTRIBUTION_METHODS["constant_one"].returns
        'scores'
        >>> del ATTRIBUTION_METHODS["constant_one"]
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"A method name must be a non-empty string; got {name!r}.")
    if returns not in RETURNS:
        raise ValueError(f"register_method({name!r}): returns must be one of {list(RETURNS)}; got {returns!r}.")

    def decorator(fn: AttributionFn) -> AttributionFn:
        ATTRIBUTION_METHODS[name] = MethodRecord(
            name,
            fn,
            resolves_target=bool(resolves_target),
            precision_sensitive=bool(precision_sensitive),
            returns=returns,
            unshardable=str(unshardable),
        )
        return fn

    return decorator


def method_record(name: str) -> MethodRecord:
    """The record of the registered method ``name``.

    Raises:
        ValueError: ``name`` is not registered, listing the registered names.

    Example:
        >>> method_record("leave_one_out").precision_sensitive
        True
    """
    if name not in ATTRIBUTION_METHODS:
        raise ValueError(
            f"Unknown attribution method {name!r}; known methods: {sorted(ATTRIBUTION_METHODS)}. "
            "A Captum attribution object is accepted too."
        )
    return ATTRIBUTION_METHODS[name]

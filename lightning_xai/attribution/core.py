"""The one verb, :func:`attribute`, over the methods of :mod:`lightning_xai.attribution.registry`.

The target helpers (:func:`resolve_target`, :func:`target_score`, ...) live in
:mod:`lightning_xai.attribution.targets` and are re-exported here; Captum objects are run by
:mod:`lightning_xai.attribution.captum_bridge`, which needs only those helpers (no import circle).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Dict, List, Literal, Mapping, Optional, Tuple, Union, cast, overload

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, as_explainable
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.attribution.captum_bridge import captum_attribute
from lightning_xai.attribution.context import explanation_context
from lightning_xai.attribution.registry import (
    ATTRIBUTION_METHODS,
    PAIRWISE_INTERACTIONS,
    SCORES,
    SCORES_AND_DELTA,
    AttributionFn,
    MethodRecord,
    method_record,
    register_method,
)
from lightning_xai.attribution.targets import (
    OUTPUTS,
    check_token_mask,
    predicted_class,
    resolve_target,
    target_probabilities,
    target_score,
)

__all__ = [
    "ATTRIBUTION_METHODS",
    "AttributionFn",
    "attribute",
    "check_method_options",
    "method_record",
    "register_method",
    "resolve_target",
    "predicted_class",
    "target_probabilities",
    "check_token_mask",
    "target_score",
    "NORMALIZATIONS",
    "OUTPUTS",
]

NORMALIZATIONS = ("l1", "max_abs")


def _lookup(method: Any) -> Tuple[MethodRecord, Dict[str, Any]]:
    if isinstance(method, str):
        return method_record(method), {}
    if callable(getattr(method, "attribute", None)):
        has_delta = callable(getattr(method, "has_convergence_delta", None)) and bool(method.has_convergence_delta())
        record = MethodRecord(
            type(method).__name__,
            captum_attribute,
            resolves_target=True,
            returns=SCORES_AND_DELTA if has_delta else SCORES,
        )
        return record, {"captum_method": method}
    raise TypeError(
        f"method must be a method name ({sorted(ATTRIBUTION_METHODS)}) or an attribution object "
        f"with an .attribute(...) method (e.g. captum.attr.Saliency); got {type(method).__name__}."
    )


def _check_options(fn: AttributionFn, name: str, options: Mapping[str, Any], also: Tuple[str, ...] = ()) -> None:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY and n != "create_graph"]
    accepted += [n for n in also if n not in accepted]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        close = {u: difflib.get_close_matches(u, accepted, n=1, cutoff=0.6) for u in unknown}
        hints = "".join(f" ({u!r}: did you mean {c[0]!r}?)" for u, c in close.items() if c)
        raise TypeError(f"Method {name!r} got unknown option(s) {unknown}{hints}; it accepts {accepted}.")


def check_method_options(method: str, options: Mapping[str, Any]) -> None:
    """Check, without running anything, that ``attribute(model, batch, method, **options)`` accepts ``options``.

    For configurations that run much later (a callback's ``method_options``): a misspelled option fails when it
    is written, not after an epoch of training. Methods whose function takes ``**kwargs`` (they pass options on,
    e.g. to Captum) are checked by :func:`attribute` when it runs.

    Args:
        method: a registered method name (:data:`ATTRIBUTION_METHODS`).
        options: the keyword options, including :func:`attribute`'s own ``normalize`` and ``create_graph``.

    Raises:
        ValueError: ``method`` is not registered, or ``normalize`` is not one of :data:`NORMALIZATIONS`.
        TypeError: an option the method does not take (naming its close match and every accepted option).

    Example:
        >>> from lightning_xai.attribution import check_method_options
        >>> check_method_options("integrated_gradients", {"n_steps": 32})
        >>> check_method_options("integrated_gradients", {"n_step": 32})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: Method 'integrated_gradients' got unknown option(s) ['n_step'] ('n_step': did you mean 'n_steps'?); it accepts [...].
    """
    record, _ = _lookup(method)
    normalize = options.get("normalize")
    if normalize is not None and normalize not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalize {normalize!r}; choose one of {list(NORMALIZATIONS)} or None.")
    _check_options(record.function, method, options, also=("normalize", "create_graph"))


def _check_returns(record: MethodRecord, rest: Tuple[Any, ...], shape: Tuple[int, ...]) -> None:
    """The result has the shape the method's record declares (a wrong fact would mislead every caller)."""
    if record.returns == SCORES and rest:
        raise RuntimeError(
            f"Method {record.name!r} returned a tuple of {1 + len(rest)}, but it is registered with "
            f"returns={SCORES!r} (a [B, T] map only); register it with the returns= that describes "
            "its result."
        )
    if record.returns == PAIRWISE_INTERACTIONS and (
        not rest or not isinstance(rest[0], Tensor) or tuple(rest[0].shape) != (*shape, shape[-1])
    ):
        found = tuple(rest[0].shape) if rest and isinstance(rest[0], Tensor) else "nothing"
        raise RuntimeError(
            f"Method {record.name!r} is registered with returns={PAIRWISE_INTERACTIONS!r}, so its "
            f"second result must be [B, T, T] = {(*shape, shape[-1])} interactions; got {found}."
        )


def _normalize(scores: Tensor, mode: str) -> Tensor:
    if mode == "l1":
        denom = scores.abs().sum(dim=1, keepdim=True)
    elif mode == "max_abs":
        denom = scores.abs().amax(dim=1, keepdim=True)
    else:
        raise ValueError(f"Unknown normalize {mode!r}; choose one of {list(NORMALIZATIONS)} or None.")
    return scores / denom.clamp_min(torch.finfo(scores.dtype).tiny)


def _empty_result(mask: Tensor, name: str, options: Mapping[str, Any]) -> Tensor:
    asked = sorted(key for key, value in options.items() if key.startswith("return_") and value)
    if asked:
        raise ValueError(
            f"The batch is empty (B = 0): {name!r} has nothing to attribute, and only the empty "
            f"[0, T] map is defined for it, not {asked}; skip empty batches."
        )
    return torch.zeros(mask.shape, dtype=torch.get_default_dtype(), device=mask.device)


@overload
def attribute(
    model: Any,
    batch: Batch,
    method: Literal["integrated_hessians"],
    target: Any = None,
    *,
    create_graph: bool = False,
    normalize: Optional[str] = None,
    **options: Any,
) -> Tuple[Tensor, ...]: ...  # (map, interactions[, delta])


@overload
def attribute(
    model: Any,
    batch: Batch,
    method: Any = "gradient",
    target: Any = None,
    *,
    create_graph: bool = False,
    normalize: Optional[str] = None,
    return_convergence_delta: Literal[True],
    **options: Any,
) -> Tuple[Tensor, ...]: ...  # (map, delta[, n_steps])


@overload
def attribute(
    model: Any,
    batch: Batch,
    method: Any = "gradient",
    target: Any = None,
    *,
    create_graph: bool = False,
    normalize: Optional[str] = None,
    return_n_steps: Literal[True],
    **options: Any,
) -> Tuple[Tensor, ...]: ...  # (map[, delta], n_steps)


@overload
def attribute(
    model: Any,
    batch: Batch,
    method: Any = "gradient",
    target: Any = None,
    *,
    create_graph: bool = False,
    normalize: Optional[str] = None,
    return_convergence_delta: Literal[False] = False,
    return_n_steps: Literal[False] = False,
    **options: Any,
) -> Tensor: ...


@overload
def attribute(
    model: Any,
    batch: Batch,
    method: Any = "gradient",
    target: Any = None,
    *,
    create_graph: bool = False,
    normalize: Optional[str] = None,
    **options: Any,
) -> Union[Tensor, Tuple[Tensor, ...]]: ...


def attribute(
    model: Any,
    batch: Batch,
    method: Any = "gradient",
    target: Any = None,
    *,
    create_graph: bool = False,
    normalize: Optional[str] = None,
    **options: Any,
) -> Union[Tensor, Tuple[Tensor, ...]]:
    """Token attributions ``[B, T]`` for ``batch`` from any :class:`ExplainableModel`.

    Methods (options in brackets, defaults first; every gradient method also takes
    ``output="probability"|"logit"|"log_probability"``, the score that is differentiated; ``None``, the default, is
    ``"probability"`` for a classifier and ``"log_probability"`` for generation):

    * ``"attention"``: the model's own attention distribution.
    * ``"gradient"``: ∂ score / ∂ embedding reduced over E [``reduction="l2"|"abs_sum"``,
      ``detach_attention=False``].
    * ``"grad_x_input"``: Σ_E (∂p/∂e)·e, Jain & Wallace's importance [``absolute=False`` (True: their
      \\|Σ_d g·e\\|), ``detach_attention=False`` (True: attention fed back as a constant override, as in
      their code)].
    * ``"integrated_gradients"``: Σ_E (e − e′)·∫∂F/∂e dα [``n_steps=50`` or ``"auto"``, ``baseline="zero"|"pad"``,
      ``rule="gauss_legendre"|"riemann_left"|"riemann_middle"|"riemann_right"|"riemann_trapezoid"``,
      ``internal_batch_size="auto"``, ``return_convergence_delta=False``, ``rtol=0.01``, ``atol=1e-6``,
      ``max_steps=256``, ``token_rtol=3e-3``, ``token_atol=1e-7``, ``start_steps=None``,
      ``return_n_steps=False``, ``pad_token_id=None``]; warns when \\|delta\\| > 5% of \\|F(x) − F(x′)\\|.
      ``n_steps="auto"``: per-row adaptive Gauss–Kronrod (G7/K15, halving the intervals whose \\|K15 − G7\\|
      is largest) until every token's error estimate is within ``max(token_atol, token_rtol·Σ_t|IG_t|)`` and
      \\|delta\\| within ``max(rtol·|F(x) − F(x′)|, atol)``, at most ``max_steps`` gradient evaluations a row
      (see :func:`~lightning_xai.attribution.integrated_gradients.integrated_gradients_map`). With ``start_steps`` given
      (or a Riemann rule): the completeness-only scheme, ``start_steps`` nodes then twice the nodes for the
      rows whose \\|delta\\| misses the tolerance, up to ``max_steps``.
    * ``"smooth_grad"``: mean map of a gradient method over noisy embeddings [``n_samples=30``,
      ``noise_level=0.15`` (σ = 0.15·(max − min) of each row's real-token embeddings), ``stdev=None``,
      ``seed=0``, ``generator=None``, ``noise=None``, ``base_method="gradient"``, plus the base method's
      options].
    * ``"leave_one_out"``: p(target|x) − p(target|x without token i) [``mode="delete"|"pad"``,
      ``signed=False`` (abs), ``internal_batch_size="auto"``].
    * any registered name (:data:`ATTRIBUTION_METHODS`), or a Captum attribution object such as
      ``captum.attr.Saliency(anything)``: its forward function is replaced by one over embeddings that returns
      probabilities (``output=``), and the ``[B, T, E]`` result is reduced by ``reduction="sum"|"l2"|"abs_sum"``;
      other options go to its ``.attribute``.

    Args:
        model: an :class:`ExplainableModel` (reference model or adapter).
        batch: a dict batch (e.g. from :class:`TextClassificationDataModule`).
        method: a method name or an attribution object.
        target: ``None`` (predicted class), an int, or ``LongTensor[B]``. For a generation model
            (:class:`~lightning_xai.adapters.capabilities.TargetSequence`): ``None`` explains the log-probability of
            the whole target (the batch's ``labels``), an int ``k`` (or ``LongTensor[B]``) the ``k``-th target
            token's, and ``"steps"`` returns one map per step, ``[B, K, T]`` (see
            :mod:`lightning_xai.attribution.targets`).
        create_graph: keep the graph so the map is differentiable w.r.t. model parameters (for losses).
            Only for methods built from differentiable ops (not Captum objects).
        normalize: ``None`` (default: raw values), ``"l1"`` (divide by Σ\\|·\\| per row) or ``"max_abs"``.
        **options: method options (see above).

    Returns:
        ``[B, T]`` float map, exactly 0 where ``model.token_mask(batch)`` is False (``[B, K, T]`` with
        ``target="steps"``, 0 at steps a row does not have); what else comes back is the method record's
        ``returns`` (:func:`method_record`): with ``return_convergence_delta``/``return_n_steps`` a tuple
        ``(map, delta[B][, n_steps[B]])``, for a ``"pairwise_interactions"`` method (Integrated Hessians)
        ``(map, interactions[B, T, T])``. An empty batch
        (B = 0) gives an empty ``[0, T]`` map without running the model (a ValueError with ``return_*`` options).
        Non-finite logits give a RuntimeWarning naming the rows; their maps are NaN, never a finite wrong map.

    Example:
        >>> from lightning_xai.attribution import attribute
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> scores = attribute(model, batch, "integrated_gradients", n_steps=16)
        >>> scores.shape, scores[1, 2].item()
        (torch.Size([2, 3]), 0.0)
    """
    model = as_explainable(model)
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of named tensors (a dict); got {type(batch).__name__}.")
    if normalize is not None and normalize not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalize {normalize!r}; choose one of {list(NORMALIZATIONS)} or None.")
    record, extra = _lookup(method)
    name = record.name
    if not extra:
        _check_options(record.function, name, options)
    with explanation_context(model, batch, freeze_parameters=not create_graph) as batch:
        mask = check_token_mask(model, batch)
        if mask.shape[0] == 0:  # B = 0: nothing to explain, an empty map (as torchmetrics' update is a no-op)
            return _empty_result(mask, name, options)
        if isinstance(target, str):
            return _per_step(model, batch, method, target, create_graph=create_graph, normalize=normalize, **options)
        if not record.resolves_target:
            with torch.no_grad():
                out = model.forward_from_embeddings(model.embed(batch), batch)
            target = resolve_target(out, target)
        result = record.function(model, batch, target, create_graph=create_graph, **extra, **options)
        # post-process inside the context: under a caller's no_grad/inference_mode the graph must survive
        scores, rest = (result[0], tuple(result[1:])) if isinstance(result, tuple) else (result, ())
        _check_returns(record, rest, tuple(mask.shape))
        if not isinstance(scores, Tensor) or tuple(scores.shape) != tuple(mask.shape):
            raise RuntimeError(
                f"Method {name!r} returned {getattr(scores, 'shape', type(scores))}; an attribution "
                f"method must return a [B, T] = {tuple(mask.shape)} map."
            )
        if not scores.is_floating_point():
            scores = scores.float()
        scores = scores.masked_fill(~mask.to(scores.device), 0.0)
        if not create_graph:
            scores = scores.detach()
        if normalize is not None:
            scores = _normalize(scores, normalize)
    return (scores, *rest) if rest else scores


def _per_step(model: Any, batch: Batch, method: Any, target: str, **options: Any) -> Union[Tensor, Tuple[Tensor, ...]]:
    """``target="steps"``: one :func:`attribute` call per target step ``k`` on the rows that have one, stacked into
    ``[B, K, T]`` (``[B, K]`` for the extra per-row results), 0 where a row has no ``k``-th step."""
    if target != "steps":
        raise ValueError(
            f"Unknown target {target!r}: the only string target is 'steps' (one map per target step of a "
            "generation model); otherwise give None, an int or a LongTensor[B]."
        )
    with torch.no_grad():
        out = model.forward_from_embeddings(model.embed(batch), batch)
    steps = getattr(out, "target_steps", None)
    if steps is None:
        raise ValueError(
            f"target='steps' explains each step of a generated target, but {type(model).__name__} "
            "explains classes (its output has no target_steps); give a class or None."
        )
    B, K = steps.shape
    parts: List[Tuple[Tensor, Union[Tensor, Tuple[Tensor, ...]]]] = []
    for k in range(K):
        rows = steps[:, k].nonzero().flatten()
        sub = gather_rows(batch, rows, B)
        parts.append((rows, attribute(model, sub, method, k, **options)))
    width = len(parts[0][1]) if parts and isinstance(parts[0][1], tuple) else 0
    stacked: List[Tensor] = []
    for i in range(max(width, 1)):
        # width is 0 only when the method returns one map: then each result is that Tensor
        pieces = [(rows, result[i] if width else cast(Tensor, result)) for rows, result in parts]
        first = pieces[0][1]
        full = first.new_zeros((B, K) + tuple(first.shape[1:]))
        for k, (rows, piece) in enumerate(pieces):
            full = full.index_put((rows, torch.full_like(rows, k)), piece.to(full.dtype))
        stacked.append(full)
    return tuple(stacked) if width else stacked[0]

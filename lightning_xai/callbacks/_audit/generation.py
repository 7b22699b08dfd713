"""Audits of a text generator (a model with the :class:`~lightning_xai.adapters.capabilities.TargetSequence`
capability: a causal LM or an encoder–decoder seen through
:class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`).

* **Decoding.** ``"force"`` (the default) explains the batch's own target (``labels``, -100 where nothing is
  explained); ``"free"`` first replaces it by the model's greedy output (``model.greedy_targets(batch,
  max_new_tokens)``), decoded again at every audit, so the audit explains what the model generates now.
* **Methods.** The explained score is ``Σ_k log p(y_k | y_<k, source)`` (``target=None``), or one step's
  log-probability; the methods that read a classifier's ``[B, C]`` logits (:data:`CLASS_LOGIT_METHODS`) are refused
  by name at setup.
* **Per step.** :func:`method_step_maps` computes every method's map of each target step (the results of
  ``attribute(..., target="steps")``, step by step with every method on the same rows, so gradient and grad×input
  share each step's backward pass); :func:`per_step_agreement` compares two ``[B, K, T]`` step maps over the ``(b, k)`` pairs where
  ``target_steps`` is true, and gives each row the mean over its steps.
* **Report.** The examples a report shows keep their step maps, source tokens × target steps (:func:`row_steps`,
  :func:`place_rows`), and their target tokens.
"""

from __future__ import annotations

import math
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import Tensor

from lightning_xai.adapters.capabilities import StepPasses, TargetSequence
from lightning_xai.adapters.huggingface.steps import IGNORE_INDEX
from lightning_xai.attribution import attribute, shared_input_gradients
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.callbacks._audit.subset import AUDIT_TOKEN_BUDGET

__all__ = [
    "CLASS_LOGIT_METHODS",
    "DECODINGS",
    "check_decoding",
    "check_generation_methods",
    "decoded_batch",
    "is_generator_model",
    "method_step_maps",
    "per_step_agreement",
    "place_rows",
    "refuse_generator",
    "row_steps",
]

#: how an audit of a generator gets its target: the batch's ``labels`` or the model's greedy output
DECODINGS = ("force", "free")
#: built-in methods that read a classifier's ``[B, C]`` logits (LRP's linear head, Integrated Hessians' second
#: derivatives of a class score, the context-mixing methods' class rollouts): they cannot explain a target sequence
CLASS_LOGIT_METHODS = (
    "lrp",
    "attnlrp",
    "integrated_hessians",
    "grad_attention",  # but on a causal LM (SELF_ATTENTION_METHODS)
    "attention_flow",
    "attention_norm",
    "alti",
    "value_zeroing",
)

#: of those, the ones a causal LM's self-attention supports (its target steps' query rows)
SELF_ATTENTION_METHODS = ("grad_attention",)


def is_generator_model(model: Any) -> bool:
    """Whether ``model`` explains a target sequence (the ``TargetSequence`` capability).

    Example:
        >>> is_generator_model(torch.nn.Linear(2, 2))
        False
    """
    return isinstance(model, TargetSequence)


def check_decoding(owner: str, decoding: str, max_new_tokens: int) -> None:
    """Refuse (at ``__init__``) an unknown ``decoding`` or a ``max_new_tokens`` that is not a positive int.

    Example:
        >>> check_decoding("AttentionAudit", "greedy", 20)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit(decoding='greedy'): choose 'force' (explain the batch's labels) or 'free' (explain the model's greedy output).
    """
    if decoding not in DECODINGS:
        raise MisconfigurationException(
            f"{owner}(decoding={decoding!r}): choose 'force' (explain the batch's labels) "
            "or 'free' (explain the model's greedy output)."
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise MisconfigurationException(
            f"{owner}(max_new_tokens={max_new_tokens!r}) must be a positive int (the "
            "longest greedy output free decoding explains)."
        )


def check_generation_methods(
    owner: str, model: Any, methods: Sequence[str], *, decoding: str = "force", per_step: bool = False
) -> None:
    """At setup: refuse, by name, the methods that cannot explain ``model``'s target sequence, and the generation
    options (free decoding, per-step maps) for a model that is not a generator.

    Example:
        >>> check_generation_methods("AttentionAudit", torch.nn.Linear(2, 2), ["gradient"], decoding="free")
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit(decoding='free') explains ...
    """
    name = type(getattr(model, "model", model)).__name__
    if not is_generator_model(model):
        if decoding != "force":
            raise MisconfigurationException(
                f"{owner}(decoding={decoding!r}) explains a generated target, but {name} is not a generator (its "
                "adapter has no TargetSequence capability: a transformers *ForCausalLM or encoder–decoder is one). "
                "Leave decoding='force' for a classifier."
            )
        if per_step:
            raise MisconfigurationException(
                f"{owner}(per_step=True) compares one map per target step, but {name} explains classes, not a "
                "target sequence; leave per_step=False."
            )
        return
    causal = bool(getattr(model, "causal", False))
    refused = [m for m in methods if m in CLASS_LOGIT_METHODS and not (causal and m in SELF_ATTENTION_METHODS)]
    if refused:
        raise MisconfigurationException(
            f"{owner} cannot explain {name}'s generated target with {refused}: these methods read a classifier's "
            "[B, C] logits (LRP's linear head, Integrated Hessians' class score, the context-mixing methods' class "
            "rollout). Use attention, gradient, grad_x_input, integrated_gradients, smooth_grad, leave_one_out, "
            + (
                "smooth_attention or grad_attention."
                if causal
                else "smooth_attention (grad_attention: causal LMs only)."
            )
        )


def decoded_batch(model: Any, batch: Dict[str, Any], decoding: str, max_new_tokens: int) -> Dict[str, Any]:
    """``batch`` as the audit explains it: itself (force decoding, or a model that is not a generator), or with its
    target replaced by ``model``'s greedy output (free decoding; no gradients, the model's modes kept).

    Example:
        >>> decoded_batch(torch.nn.Linear(2, 2), {"x": 1}, "free", 5)
        {'x': 1}
    """
    if decoding != "free" or not is_generator_model(model):
        return batch
    return model.greedy_targets(batch, max_new_tokens)


AgreementFn = Callable[..., Any]


def per_step_agreement(
    step_maps: Mapping[str, Tensor],
    steps: Tensor,
    mask: Tensor,
    pairs: Sequence[Tuple[str, str]],
    metrics: Mapping[str, AgreementFn],
    metric_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> Dict[str, Tensor]:
    """``{"<metric>/<first>_vs_<second>": [B]}``: each metric of each pair of ``[B, K, T]`` step maps, computed over
    the ``(b, k)`` pairs where ``steps`` (``[B, K]``) is true (each step's map against the other map of the same
    step, over the row's ``mask`` tokens), then averaged over a row's steps (NaN steps, e.g. a constant map, left
    out; NaN for a row without a defined step). ``metrics[name](a, b, mask, **options)`` returns ``[N]`` values or
    ``(values, p_values)`` (p-values are not averaged: they are dropped).

    Example:
        >>> a = torch.tensor([[[0.1, 0.9], [0.8, 0.2]]])
        >>> b = torch.tensor([[[0.2, 0.7], [0.1, 0.9]]])
        >>> same = lambda x, y, m: (x.argmax(-1) == y.argmax(-1)).double()
        >>> per_step_agreement({"a": a, "b": b}, torch.tensor([[True, True]]), torch.ones(1, 2, dtype=torch.bool),
        ...                    [("a", "b")], {"same": same})
        {'same/a_vs_b': tensor([0.5000], dtype=torch.float64)}
    """
    options = metric_options or {}
    where = steps.bool().nonzero()
    rows, ks = where[:, 0], where[:, 1]
    B = steps.shape[0]
    flat_mask = mask[rows.to(mask.device)]
    out: Dict[str, Tensor] = {}
    for first, second in pairs:
        a = step_maps[first][rows, ks].float()
        b = step_maps[second][rows, ks].float()
        for metric, fn in metrics.items():
            result = fn(a, b, flat_mask.to(a.device), **options.get(metric, {})) if rows.numel() else a.new_zeros(0)
            values = (result[0] if isinstance(result, tuple) else result).detach().double().cpu()
            finite = torch.isfinite(values)
            total = torch.zeros(B, dtype=torch.float64).index_add_(0, rows.cpu()[finite], values[finite])
            count = torch.zeros(B, dtype=torch.float64).index_add_(
                0, rows.cpu()[finite], torch.ones(int(finite.sum()), dtype=torch.float64)
            )
            out[f"{metric}/{first}_vs_{second}"] = torch.where(
                count > 0, total / count.clamp_min(1), torch.full_like(total, math.nan)
            )
    return out


def refuse_generator(owner: str, model: Any, why: str) -> None:
    """At setup: refuse a generator, naming the audit and why it cannot explain a target sequence (``why``).

    Example:
        >>> refuse_generator("ErasureAudit", torch.nn.Linear(2, 2), "it reads class probabilities")  # not a generator
    """
    if why and is_generator_model(model):
        raise MisconfigurationException(
            f"{owner} does not audit text generators ({type(getattr(model, 'model', model)).__name__}): {why}. "
            "AttentionAudit (decoding='force'|'free', per_step=True) and AlignmentAudit do."
        )


def place_rows(values: Tensor, rows: Tensor, shape: Sequence[int]) -> Tensor:
    """``values`` ``[R, K', ...]`` computed on ``rows`` of a batch, as a zero tensor of ``shape`` ``[B, K, ...]``
    (``K' ≤ K``: a part of a batch has at most the batch's steps) holding them at those rows.

    Example:
        >>> place_rows(torch.tensor([[1.0, 2.0]]), torch.tensor([1]), (2, 3)).tolist()
        [[0.0, 0.0, 0.0], [1.0, 2.0, 0.0]]
    """
    full = values.new_zeros(tuple(shape))
    full[rows.to(values.device), : values.shape[1]] = values
    return full


def row_steps(
    step_maps: Mapping[str, Tensor], step_mask: Tensor, labels: Tensor, row: int, real: Tensor
) -> Optional[Tuple[List[int], Dict[str, List[List[float]]]]]:
    """One row's target token ids (``labels`` ``!= -100``: one per target step, in order) and its step maps
    ``{name: [K_row][n]}`` over its ``real`` source tokens (``[T]`` bool); ``None`` when ``step_mask`` (``[B, K]``)
    gives the row no step, or its steps and labels disagree.

    Example:
        >>> maps = {"attention": torch.tensor([[[0.6, 0.4, 0.0], [0.1, 0.9, 0.0]]])}
        >>> row_steps(maps, torch.tensor([[True, True]]), torch.tensor([[7, 8, -100]]), 0,
        ...           torch.tensor([True, True, False]))
        ([7, 8], {'attention': [[0.6000000238418579, 0.4000000059604645], [0.10000000149011612, 0.8999999761581421]]})
    """
    where = step_mask[row].bool()
    target = labels[row][labels[row] != IGNORE_INDEX]
    if not bool(where.any()) or int(where.sum()) != target.numel():
        return None
    return target.tolist(), {name: m[row][where][:, real].tolist() for name, m in step_maps.items()}


def method_step_maps(
    model: Any,
    batch: Mapping[str, Any],
    steps: Tensor,
    methods: Sequence[str],
    options: Callable[[str], Mapping[str, Any]],
    precision: Callable[[str], ContextManager[Any]],
    tokens_per_pass: int = AUDIT_TOKEN_BUDGET,
) -> Dict[str, Tensor]:
    """``{method: [B, K, T]}``: each method's map of each target step's log-probability (what
    ``attribute(model, batch, method, target="steps", **options(method))`` returns, 0 at steps a row does not have),
    under ``precision(method)`` (``steps``: ``[B, K]``, the output's ``target_steps``).

    Few, wide passes: every (row, step) pair is a row of its own, explaining its step (a per-row step target), and
    the pairs go through the model in passes of at most ``tokens_per_pass`` padded tokens, every method on the same
    pass, so gradient and grad×input share its backward pass — rather than one pass per step (a target of 50 steps
    was 50 passes of the rows that have the step). A model with the :class:`~lightning_xai.adapters.capabilities.
    StepPasses` capability builds the passes itself, each copy cut to what its step reads (a transformers generator:
    the decoder positions up to the step, the LM head at its query row only); the maps are the same up to float
    summation order."""
    maps: Dict[str, Tensor] = {}
    B, K = steps.shape
    T = int(model.token_mask(batch).shape[1]) if methods else 0
    with shared_input_gradients():
        for rows, step, part, target in _step_passes(model, batch, steps, tokens_per_pass):
            for method in methods:
                with precision(method):
                    scores = attribute(model, part, method, target=target, **options(method))
                scores = (scores[0] if isinstance(scores, tuple) else scores).detach().float()
                full = maps.setdefault(method, scores.new_zeros((B, K, T)))
                full[rows.to(full.device), step.to(full.device), : scores.shape[-1]] = scores
    return maps


def _step_passes(
    model: Any, batch: Mapping[str, Any], steps: Tensor, tokens_per_pass: int
) -> Iterator[Tuple[Tensor, Tensor, Mapping[str, Any], Tensor]]:
    """``(rows, steps, batch, target)`` passes of every pair where ``steps`` is true (the model's, or whole copies)."""
    if isinstance(model, StepPasses):
        yield from model.step_passes(dict(batch), steps.bool(), int(tokens_per_pass))
        return
    B = steps.shape[0]
    pairs = steps.nonzero()  # [P, 2]: (row, step), row-major
    width = max(int(v.shape[1]) for v in batch.values() if isinstance(v, Tensor) and v.dim() >= 2)
    per_pass = max(1, int(tokens_per_pass) // max(width, 1))
    for start in range(0, pairs.shape[0], per_pass):
        rows, step = pairs[start : start + per_pass].unbind(1)
        yield rows, step, gather_rows(dict(batch), rows, B), step

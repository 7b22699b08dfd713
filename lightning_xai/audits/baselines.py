"""Baselines of the attention debate as interventions through the ``attention_override`` of the protocol.

* :func:`permutation_test` — Jain & Wallace (2019), section 4.2: permute the attention weights over the real
  tokens of each input, keep everything before the attention (hence the hidden states) fixed, and record the
  median change of the output over the permutations. Small changes despite a peaked attention mean the model
  does not rely on *which* token receives the weight.
* :func:`uniform_attention_evaluation` — Wiegreffe & Pinter (2019), section 3.1, applied at test time: replace
  the trained attention with the uniform distribution over real tokens (α = 1/L) and compare accuracy and
  macro-F1 with the trained attention. (W&P's *training* baseline — a model trained with uniform attention —
  is ``AttentionClassifier(attention="uniform")``.)

The output change is the total variation distance between the predicted class distributions,
``Δŷ = ½ Σ_c |p_c − p'_c|``; for two classes it equals J&W's ``|p₁ − p'₁|``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from lightning_xai.adapters.capabilities import OverrideScorer, packs_overrides
from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput, as_explainable
from lightning_xai.attribution.batching import repeat_rows
from lightning_xai.attribution.heads import check_softmax_head
from lightning_xai.attribution.override_replay import override_scorer
from lightning_xai.metrics.functional.divergence import total_variation

__all__ = [
    "PermutationResult",
    "bin_by_max_attention",
    "permute_attention",
    "permutation_test",
    "uniform_attention",
    "uniform_attention_evaluation",
    "uniform_attention_summary",
    "total_variation",
    "DEFAULT_MAX_ATTENTION_BINS",
]

DEFAULT_MAX_ATTENTION_BINS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)


def uniform_attention(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """``α = 1/L`` over the real tokens of each row (``mask`` ``[B, T]`` bool), 0 elsewhere.

    Example:
        >>> uniform_attention(torch.tensor([[True, True, False], [True, True, True]]))
        tensor([[0.5000, 0.5000, 0.0000],
                [0.3333, 0.3333, 0.3333]])
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}.")
    lengths = mask.sum(-1, keepdim=True)
    if (lengths == 0).any():
        raise ValueError("A row of the token mask has no real token; uniform attention over nothing is undefined.")
    return mask.to(dtype) / lengths.to(dtype)


def permute_attention(
    attention: Tensor,
    mask: Tensor,
    num_permutations: int,
    generator: Optional[torch.Generator] = None,
    row_generators: Optional[Sequence[torch.Generator]] = None,
) -> Tensor:
    """``num_permutations`` random permutations of each row's weights among its real tokens.

    Args:
        attention: ``[B, T]`` weights (0 outside ``mask``).
        mask: ``[B, T]`` bool, True at real tokens.
        num_permutations: N.
        generator: a CPU ``torch.Generator`` for reproducible permutations.
        row_generators: one CPU generator per row instead: row ``b``'s permutations then depend only on its own
            generator and its number of real tokens — not on the batch it sits in or its padding (so results do not
            depend on how examples are batched or sharded across processes).

    Returns:
        ``[N, B, T]``: row ``b`` of permutation ``n`` holds the values of ``attention[b, mask[b]]`` in a random
        order at the positions of ``mask[b]``, and 0 elsewhere.

    Example:
        >>> att = torch.tensor([[0.7, 0.2, 0.1, 0.0]])
        >>> mask = torch.tensor([[True, True, True, False]])
        >>> out = permute_attention(att, mask, 3, torch.Generator().manual_seed(0))
        >>> out.shape, bool((out.sort(-1).values == att.sort(-1).values).all()), bool((out[..., 3] == 0).all())
        (torch.Size([3, 1, 4]), True, True)
    """
    if attention.shape != mask.shape:
        raise ValueError(f"attention {tuple(attention.shape)} and mask {tuple(mask.shape)} must have the same shape.")
    if num_permutations < 1:
        raise ValueError(f"num_permutations must be >= 1, got {num_permutations}.")
    batch, width = mask.shape
    if row_generators is not None:
        if len(row_generators) != batch:
            raise ValueError(f"row_generators has {len(row_generators)} generators for {batch} rows.")
        keys = torch.full((num_permutations, batch, width), float("inf"))
        cpu_mask = mask.cpu()
        for row, gen in enumerate(row_generators):
            real = cpu_mask[row].nonzero().flatten()
            keys[:, row, real] = torch.rand(num_permutations, real.numel(), generator=gen)
        keys = keys.to(attention.device)
    else:
        keys = torch.rand(num_permutations, batch, width, generator=generator).to(attention.device)
    keys = keys.masked_fill(~mask, float("inf"))  # pads sort last and keep their (zero) weight
    source = keys.argsort(dim=-1, stable=True)  # real positions in a random order, then pads
    # Real positions in their natural order, then pads: the k-th real slot receives the k-th random source.
    target = (~mask).to(torch.int8).argsort(dim=-1, stable=True).expand(num_permutations, batch, width)
    values = attention.masked_fill(~mask, 0.0).expand(num_permutations, batch, width).gather(-1, source)
    return torch.zeros_like(values).scatter(-1, target, values)


@dataclass
class PermutationResult:
    """Per-example outcome of :func:`permutation_test`.

    Attributes:
        median_delta: ``[B]`` median over permutations of ``Δŷ`` (total variation of the output distribution).
        max_attention: ``[B]`` the largest trained attention weight of each example (J&W bin by it).
        deltas: ``[N, B]`` every permutation's ``Δŷ``.
    """

    median_delta: Tensor
    max_attention: Tensor
    deltas: Tensor


def _probabilities(
    model: ExplainableModel, embeddings: Tensor, batch: Batch, attention_override: Optional[Tensor] = None
):
    output = model.forward_from_embeddings(embeddings, batch, attention_override=attention_override)
    return output, output.logits.float().softmax(-1)


@torch.no_grad()
def permutation_test(
    model: ExplainableModel,
    batch: Batch,
    num_permutations: int = 100,
    generator: Optional[torch.Generator] = None,
    chunk_size: int = 1024,
    row_generators: Optional[Sequence[torch.Generator]] = None,
    replay: Optional[Tuple[ExplainOutput, Optional[OverrideScorer]]] = None,
) -> PermutationResult:
    """Jain & Wallace's permutation test on one batch.

    The input embeddings are computed once; the model is re-run from them with the trained attention replaced
    by each permutation (``attention_override``), so everything before the attention is unchanged. Where the model
    offers a checked override scorer (:func:`~lightning_xai.attribution.override_replay.override_scorer`) only
    what the attention changes runs: the last layer and the head of a transformer (a row's permutations packed
    into one sequence where the head reads one position), the pooling and the head of the reference BiLSTM. Run it with
    the model in ``eval()`` mode (dropout off), as J&W do.

    Args:
        model: an :class:`~lightning_xai.adapters.ExplainableModel`.
        batch: a batch the model reads.
        num_permutations: N (J&W use 100).
        generator: CPU generator for reproducible permutations.
        chunk_size: how many permuted rows run through the model at once (memory bound). A scorer that packs the
            overrides of a row (:func:`~lightning_xai.adapters.capabilities.packs_overrides`) takes every
            permutation in one call instead and runs them in passes sized to its own memory budget.
        row_generators: per-row generators (see :func:`permute_attention`).
        replay: ``override_scorer(model, model.embed(batch), batch)`` if already made for this batch (in eval mode,
            under the same precision): its pass and scorer are used instead of making them again.

    Returns:
        A :class:`PermutationResult`.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]])}
        >>> result = permutation_test(model, batch, num_permutations=10, generator=torch.Generator().manual_seed(0))
        >>> result.median_delta.shape, result.deltas.shape
        (torch.Size([2]), torch.Size([10, 2]))
    """
    model = as_explainable(model)
    check_softmax_head(model, "the permutation test")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    mask = model.token_mask(batch)
    embeddings = model.embed(batch)
    # a checked scorer of overrides runs only what the attention changes (the last layer and the head of a
    # transformer, the pooling and the head of the BiLSTM); without one every permutation re-runs the model
    base_output, scorer = replay if replay is not None else override_scorer(model, embeddings, batch)
    base_probs = base_output.logits.float().softmax(-1)
    attention = base_output.attention.detach().float()
    permuted = permute_attention(attention, mask, num_permutations, generator, row_generators)  # [N, B, T]
    batch_size = mask.shape[0]
    # permutations per call: a scorer that packs a row's overrides into one sequence takes them all (it sizes its
    # passes to its own memory budget; split over calls, each call would recompute the rows)
    per_chunk = num_permutations if packs_overrides(scorer) else max(1, chunk_size // batch_size)
    deltas = []
    for start in range(0, num_permutations, per_chunk):
        block = permuted[start : start + per_chunk]
        n = block.shape[0]
        if scorer is not None:
            rows = torch.arange(batch_size, device=mask.device).repeat(n)
            probs = scorer(rows, block.reshape(n * batch_size, -1).to(embeddings.dtype)).float().softmax(-1)
        else:
            repeated = repeat_rows(batch, n, batch_size)
            emb = embeddings.repeat(n, 1, 1)
            _, probs = _probabilities(model, emb, repeated, attention_override=block.reshape(n * batch_size, -1))
        deltas.append(total_variation(probs.view(n, batch_size, -1), base_probs.unsqueeze(0)))
    all_deltas = torch.cat(deltas, 0)
    # torch.median returns the lower of the two middle values; J&W use numpy's median (their mean).
    median = all_deltas.float().quantile(0.5, dim=0)
    max_attention = attention.masked_fill(~mask, 0.0).max(-1).values
    return PermutationResult(median_delta=median, max_attention=max_attention, deltas=all_deltas)


def bin_by_max_attention(
    median_delta: Tensor, max_attention: Tensor, edges: Sequence[float] = DEFAULT_MAX_ATTENTION_BINS
) -> Dict[str, Dict[str, float]]:
    """Median ``Δŷ`` per bin of maximum attention, as in J&W's Figure 6.

    Bins are ``[e_i, e_{i+1})`` (the last one closed). Empty bins report ``count`` 0 and ``median`` NaN.

    Example:
        >>> bins = bin_by_max_attention(torch.tensor([0.1, 0.3, 0.2]), torch.tensor([0.05, 0.6, 0.62]),
        ...                             edges=(0.0, 0.5, 1.0))
        >>> bins["[0.00,0.50)"], bins["[0.50,1.00]"]
        ({'count': 1, 'median': 0.10000000149011612}, {'count': 2, 'median': 0.25})
    """
    if median_delta.shape != max_attention.shape:
        raise ValueError("median_delta and max_attention must have the same shape.")
    edges = list(edges)
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges must be increasing with at least two values, got {edges}.")
    out: Dict[str, Dict[str, float]] = {}
    delta = median_delta.detach().float().cpu()
    peak = max_attention.detach().float().cpu()
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        last = i == len(edges) - 2
        inside = (peak >= lo) & ((peak <= hi) if last else (peak < hi))
        name = f"[{lo:.2f},{hi:.2f}{']' if last else ')'}"
        values = delta[inside]
        out[name] = {
            "count": int(values.numel()),
            "median": float(values.quantile(0.5)) if values.numel() else float("nan"),
        }
    return out


@torch.no_grad()
def uniform_attention_evaluation(
    model: ExplainableModel, batch: Batch, replay: Optional[Tuple[ExplainOutput, Optional[OverrideScorer]]] = None
) -> Dict[str, Tensor]:
    """Per-example predictions with the trained attention and with uniform attention over real tokens.

    Args:
        model: an :class:`~lightning_xai.adapters.ExplainableModel` (put it in ``eval()`` mode).
        batch: a batch with ``labels`` ``[B]``.
        replay: as in :func:`permutation_test`.

    Returns:
        ``trained_pred`` and ``uniform_pred`` ``[B]`` (argmax classes), ``labels`` ``[B]``, ``delta`` ``[B]`` (total
        variation between the two output distributions) and ``flipped`` ``[B]`` bool (the decision changed).
        Aggregate accuracies/F1 over a dataset with :func:`uniform_attention_summary`.

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4, attention="uniform").eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5], [6, 7, 0]]),
        ...          "mask": torch.tensor([[True, True, True], [True, True, False]]), "labels": torch.tensor([0, 1])}
        >>> out = uniform_attention_evaluation(model, batch)  # a uniform-attention model is unchanged by it
        >>> bool(out["delta"].max() < 1e-6), out["flipped"].tolist()
        (True, [False, False])
    """
    model = as_explainable(model)
    check_softmax_head(model, "the uniform-attention evaluation")
    if "labels" not in batch:
        raise KeyError("The batch has no 'labels'; the uniform-attention evaluation compares accuracy.")
    mask = model.token_mask(batch)
    embeddings = model.embed(batch)
    # the uniform pass as the permutations run
    output, scorer = replay if replay is not None else override_scorer(model, embeddings, batch)
    trained = output.logits.float().softmax(-1)
    if scorer is not None:
        uniform = (
            scorer(torch.arange(mask.shape[0], device=mask.device), uniform_attention(mask, embeddings.dtype))
            .float()
            .softmax(-1)
        )
    else:
        _, uniform = _probabilities(model, embeddings, batch, attention_override=uniform_attention(mask))
    trained_pred, uniform_pred = trained.argmax(-1), uniform.argmax(-1)
    return {
        "trained_pred": trained_pred,
        "uniform_pred": uniform_pred,
        "labels": batch["labels"],
        "delta": total_variation(trained, uniform),
        "flipped": trained_pred != uniform_pred,
    }


def _macro_f1(pred: Tensor, labels: Tensor, num_classes: int) -> float:
    scores = []
    for c in range(num_classes):
        tp = ((pred == c) & (labels == c)).sum().item()
        fp = ((pred == c) & (labels != c)).sum().item()
        fn = ((pred != c) & (labels == c)).sum().item()
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return sum(scores) / num_classes


def uniform_attention_summary(
    trained_pred: Tensor, uniform_pred: Tensor, labels: Tensor, num_classes: Optional[int] = None
) -> Dict[str, float]:
    """Accuracy and macro-F1 with trained vs uniform attention, and their differences (uniform − trained).

    Example:
        >>> s = uniform_attention_summary(torch.tensor([1, 1, 0, 0]), torch.tensor([1, 0, 0, 0]),
        ...                               torch.tensor([1, 1, 0, 0]))
        >>> s["accuracy_trained"], s["accuracy_uniform"], s["accuracy_delta"], s["flip_fraction"]
        (1.0, 0.75, -0.25, 0.25)
    """
    if not (trained_pred.shape == uniform_pred.shape == labels.shape):
        raise ValueError("trained_pred, uniform_pred and labels must have the same shape [N].")
    if labels.numel() == 0:
        raise ValueError("No examples to summarise.")
    trained_pred, uniform_pred, labels = (t.detach().cpu().long() for t in (trained_pred, uniform_pred, labels))
    classes = num_classes or int(max(labels.max(), trained_pred.max(), uniform_pred.max()).item()) + 1
    acc_t = (trained_pred == labels).float().mean().item()
    acc_u = (uniform_pred == labels).float().mean().item()
    f1_t, f1_u = _macro_f1(trained_pred, labels, classes), _macro_f1(uniform_pred, labels, classes)
    return {
        "accuracy_trained": acc_t,
        "accuracy_uniform": acc_u,
        "accuracy_delta": acc_u - acc_t,
        "f1_trained": f1_t,
        "f1_uniform": f1_u,
        "f1_delta": f1_u - f1_t,
        "flip_fraction": (trained_pred != uniform_pred).float().mean().item(),
    }

"""Vashishth et al. (2019)'s attention interventions on a text generator: uniform and permuted attention rows.

A generator (a model with the :class:`~lightning_xai.adapters.capabilities.TargetSequence` capability: a causal LM or
an encoder–decoder seen through :class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`) explains
the log-probability of a target sequence, one step per target token. Its attention is intervened on through the
adapter's ``attention_override``, which replaces the attention rows of the target steps in the last layer (the last
decoder layer's cross-attention of an encoder–decoder, the decoder self-attention of a causal LM), every head:

* **uniform** (Vashishth et al. 2019; Wiegreffe & Pinter 2019): each head's row becomes ``1/L`` over the ``L``
  source (prompt) tokens; the head's own mass outside the source (special tokens, a causal LM's earlier target
  tokens) is kept, the rest is shared uniformly (the adapter's ``override_specials="keep"``);
* **permuted** (Jain & Wallace 2019; Vashishth et al.): each step's row — every head — has its weights on the source
  tokens permuted at random among those tokens (one permutation per step, shared by the heads, so the identity
  permutation is the model itself); weights outside the source stay where they are.

Everything before the replaced layer is unchanged; the target is teacher-forced (the batch's ``labels``), so each
step's log-probability and greedy (argmax) token are compared with the model's own at the same prefix.
:func:`step_scores` reads both from a pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput
from lightning_xai.attribution import explanation_context
from lightning_xai.attribution.batching import repeat_rows

__all__ = ["StepScores", "generation_attention_baselines", "permute_step_rows", "step_changes", "step_scores"]


@dataclass
class StepScores:
    """What a generator's pass says about each target step.

    Attributes:
        log_probs: ``[B, K]`` ``log p(y_k | y_<k, source)`` of the target token (0 at steps a row does not have).
        greedy: ``[B, K]`` the argmax token at each step (-1 at steps a row does not have).
        steps: ``[B, K]`` bool, the steps that exist.
    """

    log_probs: Tensor
    greedy: Tensor
    steps: Tensor


def step_scores(output: ExplainOutput) -> StepScores:
    """The target log-probabilities and greedy tokens of a generator's pass (``extras["step_queries"]`` says which
    query row predicts each step).

    Example:
        >>> from types import SimpleNamespace
        >>> out = SimpleNamespace(logits=torch.tensor([[[0.0, 2.0], [3.0, 0.0]]]),
        ...                       target_log_probs=torch.tensor([[-0.1, -2.0]]),
        ...                       target_steps=torch.tensor([[True, False]]),
        ...                       extras={"step_queries": torch.tensor([[1, 0]])})
        >>> s = step_scores(out)
        >>> s.greedy.tolist(), s.log_probs.tolist()
        ([[0, -1]], [[-0.10000000149011612, 0.0]])
    """
    if output.target_steps is None or output.target_log_probs is None:
        raise ValueError(
            "step_scores reads a generator's output (target_log_probs and target_steps); this output "
            "has none: explain a causal LM or encoder–decoder through HuggingFaceAdapter."
        )
    steps = output.target_steps.bool()
    queries = output.extras["step_queries"].long()
    logits = output.logits
    rows = torch.arange(logits.shape[0], device=logits.device)[:, None].expand_as(queries)
    greedy = logits[rows, queries.to(logits.device)].argmax(-1).to(steps.device).masked_fill(~steps, -1)
    log_probs = output.target_log_probs.detach().masked_fill(~steps, 0.0)
    return StepScores(log_probs=log_probs, greedy=greedy, steps=steps)


def step_changes(base: StepScores, changed: StepScores) -> Dict[str, Tensor]:
    """``[B]`` float64 changes from ``base`` to ``changed`` (the same target; steps ``base.steps``):
    ``log_prob_change`` Σ_k Δ log p(y_k), ``log_prob_change_per_token`` its mean over the row's steps,
    ``abs_log_prob_change_per_token`` the mean of |Δ log p(y_k)|, ``greedy_token_changed`` the share of steps whose
    argmax token differs.

    Example:
        >>> base = StepScores(torch.tensor([[-1.0, -2.0]]), torch.tensor([[4, 5]]), torch.tensor([[True, True]]))
        >>> new = StepScores(torch.tensor([[-1.5, -1.0]]), torch.tensor([[4, 6]]), torch.tensor([[True, True]]))
        >>> changes = step_changes(base, new)
        >>> changes["log_prob_change"].item(), changes["log_prob_change_per_token"].item()
        (0.5, 0.25)
        >>> changes["abs_log_prob_change_per_token"].item(), changes["greedy_token_changed"].item()
        (0.75, 0.5)
    """
    steps = base.steps
    K = steps.shape[1]
    new_lp, new_greedy = changed.log_probs[:, :K], changed.greedy[:, :K]
    delta = (new_lp.double() - base.log_probs.double()).masked_fill(~steps, 0.0)
    count = steps.sum(1).clamp_min(1).double()
    flipped = ((new_greedy != base.greedy) & steps).sum(1).double()
    return {
        "log_prob_change": delta.sum(1),
        "log_prob_change_per_token": delta.sum(1) / count,
        "abs_log_prob_change_per_token": delta.abs().sum(1) / count,
        "greedy_token_changed": flipped / count,
    }


def permute_step_rows(
    rows: Tensor, mask: Tensor, steps: Tensor, num_permutations: int, row_generators: Sequence[torch.Generator]
) -> Tensor:
    """``[N, B, K, H, T]``: ``num_permutations`` copies of the step rows ``rows`` ``[B, K, H, T]`` with each step's
    weights on the source tokens (``mask`` ``[B, T]``) permuted among those tokens, one permutation per step shared
    by the heads; positions outside ``mask`` keep their weights. Row ``b``'s permutations depend only on its
    generator, its number of steps and of source tokens (not on the batch it sits in).

    Example:
        >>> rows = torch.tensor([[[[0.5, 0.3, 0.2]]]])  # B=1, K=1, H=1, T=3
        >>> out = permute_step_rows(rows, torch.tensor([[True, True, False]]), torch.tensor([[True]]), 4,
        ...                         [torch.Generator().manual_seed(0)])
        >>> out.shape, sorted(out[:, 0, 0, 0, :2].flatten().tolist()[:2]), bool((out[..., 2] == 0.2).all())
        (torch.Size([4, 1, 1, 1, 3]), [0.30000001192092896, 0.5], True)
    """
    B, K, H, T = rows.shape
    if len(row_generators) != B:
        raise ValueError(f"row_generators has {len(row_generators)} generators for {B} rows.")
    index = torch.arange(T).expand(num_permutations, B, K, T).clone()
    cpu_mask, counts = mask.cpu(), steps.sum(1).cpu()
    for b, gen in enumerate(row_generators):
        real = cpu_mask[b].nonzero().flatten()
        k_b = int(counts[b])
        order = torch.rand(num_permutations, k_b, real.numel(), generator=gen).argsort(-1)
        view = index[:, b, :k_b]
        view[..., real] = real[order]
    index = index.to(rows.device)[:, :, :, None, :].expand(num_permutations, B, K, H, T)
    return rows.unsqueeze(0).expand(num_permutations, B, K, H, T).gather(-1, index)


def _uniform(mask: Tensor) -> Tensor:
    return mask.float() / mask.sum(1, keepdim=True).clamp_min(1).float()


@torch.no_grad()
def generation_attention_baselines(
    model: ExplainableModel,
    batch: Batch,
    *,
    num_permutations: int = 100,
    row_generators: Optional[Sequence[torch.Generator]] = None,
    permutation: bool = True,
    uniform: bool = True,
    max_rows: int = 256,
) -> Dict[str, Tensor]:
    """Uniform and permuted attention rows of a generator's target steps (see the module docstring).

    Returns ``[B]`` float64 values: for ``uniform``, ``uniform/<change>`` for each change of :func:`step_changes`
    (uniform − trained attention); for ``permutation``, ``permutation/<change>``: the median over the permutations
    of each log-probability change and the mean over them of ``greedy_token_changed``. The model is run in eval
    mode (modes restored), without gradients.

    Args:
        model: a generator's adapter (``target_log_probs`` and ``extras["step_rows"]`` in its output).
        batch: a generation batch (``labels``: the target).
        num_permutations: permutations per example.
        row_generators: one CPU generator per row (default: seeded 0, 1, ...).
        permutation / uniform: which baselines to run.
        max_rows: rows per forward pass of the permuted copies.
    """
    out: Dict[str, Tensor] = {}
    with explanation_context(model, batch) as safe, torch.no_grad():
        mask = model.token_mask(safe)
        B = mask.shape[0]
        embeddings = model.embed(safe)
        output = model.forward_from_embeddings(embeddings, safe)
        base = step_scores(output)
        if uniform:
            changed = step_scores(model.forward_from_embeddings(embeddings, safe, attention_override=_uniform(mask)))
            out.update({f"uniform/{k}": v for k, v in step_changes(base, changed).items()})
        if permutation:
            generators = row_generators or [torch.Generator().manual_seed(b) for b in range(B)]
            permuted = permute_step_rows(
                output.extras["step_rows"].detach(), mask, base.steps, num_permutations, generators
            )
            per_pass = max(1, max_rows // max(B, 1))
            found: Dict[str, list] = {}
            for start in range(0, num_permutations, per_pass):
                block = permuted[start : start + per_pass]
                n = block.shape[0]
                repeated = repeat_rows(safe, n, B)
                result = model.forward_from_embeddings(
                    embeddings.repeat(n, 1, 1), repeated, attention_override=block.reshape(n * B, *block.shape[2:])
                )
                tiled = StepScores(base.log_probs.repeat(n, 1), base.greedy.repeat(n, 1), base.steps.repeat(n, 1))
                for key, value in step_changes(tiled, step_scores(result)).items():
                    found.setdefault(key, []).append(value.view(n, B))
            for key, parts in found.items():
                values = torch.cat(parts, 0)
                summary = values.mean(0) if key == "greedy_token_changed" else values.quantile(0.5, dim=0)
                out[f"permutation/{key}"] = summary
    return out

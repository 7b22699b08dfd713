"""Adversarial attention: Jain & Wallace's per-instance search, measured with their divergences.

The divergences (:func:`kl_divergence`, :func:`jensen_shannon_divergence`, :func:`total_variation`) live in
:mod:`lightning_xai.metrics.functional.divergence` (Jain & Wallace's formulas: natural log, ``eps = 1e-10`` inside
the logarithms, so ``JSD ≤ ln 2 ≈ 0.693``) and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel, as_explainable
from lightning_xai.attribution import explanation_context
from lightning_xai.attribution.batching import repeat_rows
from lightning_xai.attribution.heads import check_softmax_head
from lightning_xai.attribution.override_replay import override_scorer
from lightning_xai.metrics.functional.divergence import jensen_shannon_divergence, kl_divergence, total_variation

__all__ = [
    "AdversarialSearchResult",
    "adversarial_attention_search",
    "jensen_shannon_divergence",
    "kl_divergence",
    "summarize_search",
    "total_variation",
]


@dataclass
class AdversarialSearchResult:
    """What :func:`adversarial_attention_search` found for a batch of ``B`` instances and ``K`` candidates.

    Attributes:
        max_jsd: ``[B]`` the largest JSD(α̃, α) among candidates whose output change is within
            ``max_output_change``; ``nan`` where no candidate qualified.
        attention: ``[B, T]`` that candidate (the original attention where none qualified).
        found: ``[B]`` bool, whether a candidate qualified.
        output_change: ``[B]`` TVD(ŷ̃, ŷ) of the reported candidate (0 where none qualified).
        candidate_jsd: ``[B, K]`` JSD of every final candidate to the original attention.
        candidate_output_change: ``[B, K]`` TVD of every final candidate's prediction to the original one.
        original_attention: ``[B, T]`` the model's own attention.
        original_probs: ``[B, C]`` the model's own prediction.
    """

    max_jsd: Tensor
    attention: Tensor
    found: Tensor
    output_change: Tensor
    candidate_jsd: Tensor
    candidate_output_change: Tensor
    original_attention: Tensor
    original_probs: Tensor


def adversarial_attention_search(
    model: ExplainableModel,
    batch: Batch,
    *,
    num_candidates: int = 5,
    steps: int = 500,
    lr: float = 0.01,
    init_std: float = 3.0,
    output_penalty: float = 500.0,
    output_tolerance: float = 0.01,
    max_output_change: float = 0.05,
    diversity_weight: float = 1.0,
    seed: int = 0,
    fixed_hidden: bool = True,
) -> AdversarialSearchResult:
    """Jain & Wallace's per-instance adversarial attention search, batched over instances and candidates.

    For each instance, ``K`` attention candidates α̃ₖ = softmax(zₖ) over the real tokens start at
    ``z = log(1/L) + N(0, init_std²)`` and are optimised with Adam (amsgrad) to minimise::

        −JSD(α̃ₖ, α) + output_penalty · ReLU(Δŷₖ − output_tolerance) − diversity_weight · mean_{j≠k} JSD(α̃ₖ, α̃ⱼ)

    where Δŷ = TVD(ŷ(α̃), ŷ(α)) = ½Σ_c|Δp_c| (for two classes exactly J&W's |Δσ(logit)| on their single
    sigmoid output). After ``steps`` steps, candidates with Δŷ ≤ ``max_output_change`` are kept and the largest
    JSD(α̃, α) among them is reported. All instances and candidates are optimised in one batched tensor;
    instances are independent (the loss is a sum, Adam is per-coordinate).

    Hidden states stay fixed, as in J&W: with ``fixed_hidden=True`` every step scores the candidates through the
    model's checked override scorer (:func:`~lightning_xai.attribution.override_replay.override_scorer`) — for
    the reference ``AttentionClassifier`` (:class:`~lightning_xai.adapters.capabilities.LinearHead`)
    ``linear_head()(Σ α̃_t h_t)`` from hidden states computed once, for a transformer adapter
    (:class:`~lightning_xai.adapters.capabilities.OverrideReplay`) its last layer and head with the earlier layers
    replayed (the candidates of a row packed into one sequence where the head reads one position), forward and
    backward. A model without one (or ``fixed_hidden=False``) is re-run through
    ``forward_from_embeddings(..., attention_override=α̃)`` at every step with its embeddings fixed.

    The model's mode, parameters and gradients are left untouched; the search runs with a seeded generator,
    so equal inputs and seed give equal results.

    Args:
        model: an explainable model (reference model or adapter).
        batch: a batch dict with ``input_ids``/``mask`` (whatever the model reads).
        num_candidates: K, candidates per instance (J&W: 5).
        steps: Adam steps (J&W: 500).
        lr: Adam learning rate (J&W: 0.01, amsgrad).
        init_std: std of the Gaussian noise added to the uniform log-attention (J&W: 3).
        output_penalty: weight of the hinge on the output change (J&W: 500).
        output_tolerance: the hinge's threshold (J&W: 0.01).
        max_output_change: keep candidates whose Δŷ is at most this (J&W: 0.05).
        diversity_weight: weight of the mean pairwise JSD among candidates (J&W: 1).
        seed: seed of the initial noise.
        fixed_hidden: use the fast fixed-hidden-state path where the model allows it.

    Returns:
        An :class:`AdversarialSearchResult`.

    Example:
        >>> import torch
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6], [6, 7, 8, 0]]),
        ...          "mask": torch.tensor([[True, True, True, True], [True, True, True, False]])}
        >>> result = adversarial_attention_search(model, batch, steps=50)
        >>> result.max_jsd.shape, bool(result.found.all()), bool((result.output_change <= 0.05).all())
        (torch.Size([2]), True, True)
    """
    model = as_explainable(model)
    check_softmax_head(model, "the adversarial attention search")
    if num_candidates < 1 or steps < 0:
        raise ValueError(f"num_candidates must be >= 1 and steps >= 0, got {num_candidates} and {steps}.")
    # eval mode, gradients on (also under inference mode), parameters frozen and restored on exit
    with explanation_context(model, batch, freeze_parameters=True) as batch:
        mask = model.token_mask(batch).bool()
        size, length = mask.shape
        k = num_candidates
        with torch.no_grad():
            embeddings = model.embed(batch).detach()
            if fixed_hidden:  # a checked scorer of overrides, or None (then every step re-runs the model)
                original, scorer = override_scorer(model, embeddings, batch)
            else:
                original, scorer = model.forward_from_embeddings(embeddings, batch), None
            base_attention = original.attention.detach()
            base_probs = original.logits.detach().softmax(-1)
        big_batch = repeat_rows(batch, k, size, interleave=True) if scorer is None else None
        big_embeddings = embeddings.repeat_interleave(k, dim=0) if scorer is None else None
        candidate_rows = torch.arange(size, device=mask.device).repeat_interleave(k)  # row b's candidates: b·k …
        cand_mask = mask.unsqueeze(1).expand(size, k, length)
        lengths = mask.sum(-1, keepdim=True).unsqueeze(1).to(embeddings.dtype)  # [B, 1, 1]

        generator = torch.Generator(device="cpu").manual_seed(seed)
        noise = torch.randn((size, k, length), generator=generator, dtype=torch.float32).to(
            device=embeddings.device, dtype=embeddings.dtype
        )
        logits_param = (torch.log(1.0 / lengths).expand(size, k, length) + init_std * noise).requires_grad_(True)
        optimizer = torch.optim.Adam([logits_param], lr=lr, amsgrad=True)

        def evaluate(z: Tensor) -> tuple:
            attn = torch.softmax(z.masked_fill(~cand_mask, float("-inf")), -1).masked_fill(~cand_mask, 0.0)
            if scorer is not None:
                probs = scorer(candidate_rows, attn.reshape(size * k, length)).softmax(-1).reshape(size, k, -1)
            else:
                assert big_embeddings is not None and big_batch is not None  # built above when scorer is None
                out = model.forward_from_embeddings(
                    big_embeddings, big_batch, attention_override=attn.reshape(size * k, length)
                )
                probs = out.logits.softmax(-1).reshape(size, k, -1)
            return attn, probs

        for _ in range(steps):
            attn, probs = evaluate(logits_param)
            jsd_to_base = jensen_shannon_divergence(attn, base_attention.unsqueeze(1))  # [B, K]
            change = total_variation(probs, base_probs.unsqueeze(1))
            loss = -jsd_to_base + output_penalty * torch.relu(change - output_tolerance)
            if k > 1 and diversity_weight:
                pairwise = jensen_shannon_divergence(attn.unsqueeze(2), attn.unsqueeze(1))  # [B, K, K]
                loss = loss - diversity_weight * pairwise.sum(-1) / (k - 1)
            # only the candidates' logits get a gradient: nothing accumulates on the model's parameters
            (logits_param.grad,) = torch.autograd.grad(loss.sum(), logits_param)
            optimizer.step()
        with torch.no_grad():
            attn, probs = evaluate(logits_param)
            cand_jsd = jensen_shannon_divergence(attn, base_attention.unsqueeze(1))
            cand_change = total_variation(probs, base_probs.unsqueeze(1))

    ok = cand_change <= max_output_change
    scored = cand_jsd.masked_fill(~ok, float("-inf"))
    best = scored.argmax(-1)
    found = ok.any(-1)
    rows = torch.arange(size, device=best.device)
    max_jsd = torch.where(found, cand_jsd[rows, best], torch.full_like(cand_jsd[:, 0], float("nan")))
    attention = torch.where(found.unsqueeze(-1), attn[rows, best], base_attention)
    output_change = torch.where(found, cand_change[rows, best], torch.zeros_like(cand_change[:, 0]))
    return AdversarialSearchResult(
        max_jsd=max_jsd.detach(),
        attention=attention.detach(),
        found=found,
        output_change=output_change.detach(),
        candidate_jsd=cand_jsd.detach(),
        candidate_output_change=cand_change.detach(),
        original_attention=base_attention,
        original_probs=base_probs,
    )


def summarize_search(max_jsd: Tensor, threshold: float = 0.3) -> Dict[str, float]:
    """Distribution summary of per-instance max JSD (``nan`` = no qualifying candidate counts as a failure).

    Returns the count, the fraction found, the fraction with JSD ≥ ``threshold`` and quantiles of the found ones.

    Example:
        >>> s = summarize_search(torch.tensor([0.1, 0.5, float("nan"), 0.6]))
        >>> s["fraction_found"], s["fraction_at_least_threshold"]
        (0.75, 0.5)
    """
    found = ~torch.isnan(max_jsd)
    values = max_jsd[found].double()
    summary = {
        "count": float(max_jsd.numel()),
        "fraction_found": found.double().mean().item() if max_jsd.numel() else 0.0,
        "fraction_at_least_threshold": (found & (max_jsd >= threshold)).double().mean().item()
        if max_jsd.numel()
        else 0.0,
        "threshold": float(threshold),
    }
    if values.numel():
        qs = torch.quantile(values, torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64))
        summary.update(
            {
                "mean": values.mean().item(),
                "q10": qs[0].item(),
                "q25": qs[1].item(),
                "median": qs[2].item(),
                "q75": qs[3].item(),
                "q90": qs[4].item(),
            }
        )
    return summary

"""Sanity checks for saliency methods: do they explain the *model*, and only the model?

* :func:`input_invariance` — Kindermans et al. (2019), "The (un)reliability of saliency methods": every
  embedding is shifted by a constant vector ``c`` and the first layer's bias is compensated, so the shifted
  model computes exactly the same function of the tokens. A method *passes* when its map is unchanged.
  Gradients, attention and leave-one-out pass; gradient×input, zero-baseline Integrated Gradients and LRP
  (which multiply by the input) fail; IG with the pad-token baseline passes because the baseline moves
  with the inputs.
* :func:`model_randomization` — Adebayo et al. (2018), "Sanity checks for saliency maps": layers are
  re-initialised from the output down (``cascading``) or one at a time (``independent``); a method that
  explains the model must produce maps that change, i.e. a rank correlation (Kendall τ-b per example over
  its real tokens) with the original map near 0.
* :func:`completeness` — Integrated Gradients' completeness (Σ attributions = F(x) − F(x′)) at several step
  counts, and LRP's conservation (Σ relevance = target logit) with and without bias absorption.

Every check returns a :class:`SanityTable` (tidy rows, ``to_markdown()``); :func:`run_sanity_checks` runs
them all (the :class:`~lightning_xai.callbacks.sanity.SanityCheck` callback calls it).
The checks live in :mod:`~lightning_xai.audits.input_invariance`, :mod:`~lightning_xai.audits.randomization` and
here (:func:`completeness`); their result type in :mod:`~lightning_xai.audits.sanity_table`. This module keeps
every name importable from one place.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Sequence

import torch
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, as_explainable
from lightning_xai.attribution import attribute, explanation_context, predicted_class
from lightning_xai.audits.input_invariance import DEFAULT_INVARIANCE_METHODS, input_invariance, shifted_model
from lightning_xai.audits.randomization import DEFAULT_RANDOMIZATION_METHODS, model_randomization
from lightning_xai.audits.sanity_table import MethodSpec, SanityTable

__all__ = [
    "DEFAULT_INVARIANCE_METHODS",
    "DEFAULT_RANDOMIZATION_METHODS",
    "MethodSpec",
    "SanityTable",
    "completeness",
    "input_invariance",
    "model_randomization",
    "run_sanity_checks",
    "shifted_model",
]


def completeness(
    model: Any,
    batch: Batch,
    n_steps: Sequence[int] = (8, 32, 128),
    *,
    baseline: str = "zero",
    tolerance: float = 0.05,
    lrp_eps: float = 1e-6,
) -> SanityTable:
    """Completeness of Integrated Gradients and conservation of LRP.

    For IG (probability of the predicted class, Gauss–Legendre) the error is ``|Σ attr − (F(x) − F(x′))|``
    relative to ``|F(x) − F(x′)|``; for LRP ``|Σ R − logit|`` relative to ``|logit|`` (``bias_factor`` 1:
    conserved by construction, 0: biases absorb their share — reported to show how much).

    Returns:
        rows ``method, setting, mean_rel_error, max_rel_error, passes`` (max relative error ≤ ``tolerance``).

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> _ = torch.manual_seed(0)
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> table = completeness(model, batch, n_steps=(16,))
        >>> table.row(method="integrated_gradients")["passes"], table.row(setting="bias_factor=1")["passes"]
        (True, True)
    """
    model = as_explainable(model)
    rows = []
    per_example: Dict[str, Tensor] = {}
    for steps in n_steps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scores, delta = attribute(
                model,
                batch,
                "integrated_gradients",
                n_steps=int(steps),
                baseline=baseline,
                return_convergence_delta=True,
            )
        gap = (scores.sum(1) - delta).abs().double()  # Σattr − delta = F(x) − F(x′)
        rel = delta.abs().double() / gap.clamp_min(1e-12)
        rows.append(
            {
                "method": "integrated_gradients",
                "setting": f"n_steps={int(steps)}, baseline={baseline}",
                "mean_rel_error": float(rel.mean()),
                "max_rel_error": float(rel.max()),
                "passes": bool(rel.max() <= tolerance),
            }
        )
        per_example[f"integrated_gradients_{int(steps)}_steps/relative_error"] = rel.detach().cpu()
    try:
        target = predicted_class(model, batch)
        with explanation_context(model, batch) as clean, torch.no_grad():
            logit = model.forward_from_embeddings(model.embed(clean), clean).logits.gather(1, target[:, None])[:, 0]
        for factor in (1.0, 0.0):
            _, delta = attribute(
                model, batch, "lrp", target=target, eps=lrp_eps, bias_factor=factor, return_convergence_delta=True
            )
            rel = delta.abs().double() / logit.abs().double().clamp_min(1e-12)
            rows.append(
                {
                    "method": "lrp",
                    "setting": f"bias_factor={factor:g}",
                    "mean_rel_error": float(rel.mean()),
                    "max_rel_error": float(rel.max()),
                    "passes": bool(rel.max() <= tolerance),
                }
            )
            per_example[f"lrp_bias_factor_{factor:g}/relative_error"] = rel.detach().cpu()
    except ValueError as error:
        if "LRP does not support" not in str(error):
            raise
    notes = (
        f"Relative error of IG's completeness (|delta| / |F(x) - F(x')|) and of LRP's conservation "
        f"(|sum R - logit| / |logit|); passes when the largest is <= {tolerance:g}. LRP with bias_factor=0 "
        "is not meant to conserve: the biases absorb relevance."
    )
    return SanityTable("completeness", rows, notes, per_example=per_example)


def run_sanity_checks(
    model: Any,
    batch: Batch,
    *,
    checks: Sequence[str] = ("input_invariance", "model_randomization", "completeness"),
    **options: Any,
) -> Dict[str, SanityTable]:
    """Run the named checks (default: all three) on one batch; ``options`` go to the checks by name prefix
    (``input_invariance_methods=...``, ``model_randomization_mode=...``, ``completeness_n_steps=...``).

    Example:
        >>> from lightning_xai.models import AttentionClassifier
        >>> model = AttentionClassifier(vocab_size=20, embedding_dim=8, hidden_dim=4).eval()
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "mask": torch.ones(1, 4, dtype=torch.bool)}
        >>> sorted(run_sanity_checks(model, batch, checks=["completeness"], completeness_n_steps=(8,)))
        ['completeness']
    """
    functions: Dict[str, Callable[..., SanityTable]] = {
        "input_invariance": input_invariance,
        "model_randomization": model_randomization,
        "completeness": completeness,
    }
    unknown = [c for c in checks if c not in functions]
    if unknown:
        raise ValueError(f"Unknown sanity check(s) {unknown}; choose from {sorted(functions)}.")
    per_check = {
        name: {key[len(name) + 1 :]: value for key, value in options.items() if key.startswith(name + "_")}
        for name in checks
    }
    extra = sorted(set(options) - {f"{name}_{key}" for name, kwargs in per_check.items() for key in kwargs})
    if extra:
        raise TypeError(f"Options {extra} match no check that runs; prefix them with one of {list(checks)}.")
    return {name: functions[name](model, batch, **per_check[name]) for name in checks}

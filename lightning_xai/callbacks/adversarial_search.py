"""Jain & Wallace's per-instance adversarial attention search as an audit callback: its distribution over time."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.audits.adversarial import adversarial_attention_search, summarize_search
from lightning_xai.callbacks._audit.failures import defined_examples
from lightning_xai.callbacks._audit.model import refuse_non_softmax
from lightning_xai.callbacks.base import AuditCallback, AuditExample, AuditPrediction, BatchResult

__all__ = ["AdversarialSearchAudit"]


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MisconfigurationException(f"AdversarialSearchAudit({name}) must be a positive int, got {value!r}.")


def _positive_float(name: str, value: Any, upper: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= upper:
        bound = "" if math.isinf(upper) else f" and <= {upper:g}"
        raise MisconfigurationException(f"AdversarialSearchAudit({name}) must be a number > 0{bound}, got {value!r}.")


class AdversarialSearchAudit(AuditCallback):
    """Jain & Wallace's per-instance adversarial attention search on a fixed audit subset, while training.

    For each audited example :func:`~lightning_xai.audits.adversarial_attention_search` optimises
    ``num_candidates`` attention distributions to be far (JSD) from the model's own while keeping the output
    within ``max_output_change`` (TVD of the predictions); the example's value is the largest JSD among the
    qualifying candidates (``nan`` when none qualified). Logged under ``adversarial_search/`` (the distribution,
    as :func:`~lightning_xai.audits.summarize_search` computes it):

    * ``fraction_found`` — share of examples with a qualifying candidate (|Δŷ| ≤ ``max_output_change``);
    * ``fraction_jsd_at_least_threshold`` — share whose max JSD is ≥ ``jsd_threshold`` (J&W: 0.3 is "very
      different"); examples without a qualifying candidate count as failures;
    * ``jsd/mean``, ``jsd/q10``, ``jsd/q25``, ``jsd/median``, ``jsd/q75``, ``jsd/q90`` — over the found ones;
    * ``output_change/mean`` — mean TVD of the reported candidates (found examples).

    The output change is a TVD of softmax distributions: a multi-label or regression model is refused at setup.

    Per example (for the reports) the values ``max_jsd``, ``output_change`` and ``found`` and the maps
    ``attention`` and ``adversarial_attention`` are kept.

    The search runs with the hidden states fixed (J&W's setting; the fast path for the reference model) and is
    seeded with ``seed``: the same subset, audit batch size and number of processes give the same numbers as
    calling the search directly on the same batches with ``seed=seed``. (Its initial noise is drawn per batch,
    so another batch size changes the draws, not the distribution.) Cost: ``steps`` forward/backward passes
    of the pooling head per audit batch — of the order of 0.1 s per SST-2 sentence at J&W's 500 steps on
    one CPU thread, hence the smaller default subset.

    Args:
        num_candidates: K, candidates per example (J&W: 5).
        steps: Adam steps of the search (J&W: 500).
        lr: Adam learning rate of the search (J&W: 0.01).
        max_output_change: keep candidates whose prediction moved by at most this TVD (J&W: 0.05).
        jsd_threshold: the JSD bar of ``fraction_jsd_at_least_threshold`` (J&W: 0.3).
        search_options: further keyword arguments of ``adversarial_attention_search`` (``init_std``,
            ``output_penalty``, ``output_tolerance``, ``diversity_weight``, ``fixed_hidden``).
        **kwargs: scheduling and subset options of :class:`~lightning_xai.callbacks.AuditCallback`
            (``num_samples`` defaults to 64 here).

    Example:
        >>> audit = AdversarialSearchAudit(steps=100, num_samples=32, every_n_epochs=2)
        >>> audit.steps, audit.num_samples
        (100, 32)
        >>> AdversarialSearchAudit(max_output_change=0)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AdversarialSearchAudit(max_output_change) must be a number > 0 and <= 1, got 0.
    """

    name = "adversarial_search"
    needs_attention_override = True  # the adversarial attentions are fed back as overrides
    refuses_generation = (
        "the search constrains the change of the output distribution over classes (TVD), which a "
        "target sequence does not have"
    )
    _SEARCH_OPTIONS = ("init_std", "output_penalty", "output_tolerance", "diversity_weight", "fixed_hidden")

    def __init__(
        self,
        num_candidates: int = 5,
        steps: int = 500,
        lr: float = 0.01,
        max_output_change: float = 0.05,
        jsd_threshold: float = 0.3,
        search_options: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("num_samples", 64)
        super().__init__(**kwargs)
        _positive_int("num_candidates", num_candidates)
        _positive_int("steps", steps)
        _positive_float("lr", lr)
        _positive_float("max_output_change", max_output_change, upper=1.0)
        _positive_float("jsd_threshold", jsd_threshold, upper=math.log(2.0))
        options = dict(search_options or {})
        unknown = sorted(set(options) - set(self._SEARCH_OPTIONS))
        if unknown:
            raise MisconfigurationException(
                f"AdversarialSearchAudit(search_options) got unknown option(s) {unknown}; allowed: "
                f"{list(self._SEARCH_OPTIONS)} (num_candidates, steps, lr and max_output_change are arguments)."
            )
        self.num_candidates = num_candidates
        self.steps = steps
        self.lr = float(lr)
        self.max_output_change = float(max_output_change)
        self.jsd_threshold = float(jsd_threshold)
        self.search_options = options

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        refuse_non_softmax(
            "AdversarialSearchAudit",
            self.explainable(pl_module),  # at setup, not the first audit
            "the adversarial attention search",
        )

    def _state_config(self) -> Dict[str, Any]:
        return dict(
            super()._state_config(),
            num_candidates=self.num_candidates,
            steps=self.steps,
            max_output_change=self.max_output_change,
        )

    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: List[int],
        prediction: Optional[AuditPrediction] = None,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        result = adversarial_attention_search(
            model,
            batch,
            num_candidates=self.num_candidates,
            steps=self.steps,
            lr=self.lr,
            max_output_change=self.max_output_change,
            seed=self.seed,
            **self.search_options,
        )
        found = BatchResult(
            maps={"attention": result.original_attention, "adversarial_attention": result.attention},
            values={"max_jsd": result.max_jsd, "output_change": result.output_change, "found": result.found.double()},
        )
        return found, {}

    def histogram_keys(self, examples: List[AuditExample]) -> List[str]:
        return ["max_jsd"] if examples else []

    def aggregate(self, examples: List[AuditExample], extras: Dict[str, Any]) -> Dict[str, float]:
        if not examples:
            return {}
        examples = defined_examples(examples)  # rows with non-finite logits: no prediction to keep, left out
        if not examples:
            keys = ("fraction_found", "fraction_jsd_at_least_threshold", "jsd/mean", "output_change/mean")
            return {"count": 0.0, **{key: float("nan") for key in keys}}
        max_jsd = torch.tensor([e.values["max_jsd"] for e in examples], dtype=torch.float64)
        summary = summarize_search(max_jsd, threshold=self.jsd_threshold)
        out = {
            "fraction_found": summary["fraction_found"],
            "fraction_jsd_at_least_threshold": summary["fraction_at_least_threshold"],
            "count": summary["count"],
        }
        for key in ("mean", "q10", "q25", "median", "q75", "q90"):
            out[f"jsd/{key}"] = summary.get(key, float("nan"))
        changes = [e.values["output_change"] for e in examples if e.values["found"] > 0]
        out["output_change/mean"] = float(sum(changes) / len(changes)) if changes else float("nan")
        return out

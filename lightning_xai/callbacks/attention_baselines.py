"""Jain & Wallace's permutation test and Wiegreffe & Pinter's uniform-attention evaluation, while training (and
Vashishth et al.'s on text generators)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.attribution.override_replay import override_scorer
from lightning_xai.audits.baselines import (
    DEFAULT_MAX_ATTENTION_BINS,
    bin_by_max_attention,
    permutation_test,
    uniform_attention_evaluation,
    uniform_attention_summary,
)
from lightning_xai.audits.generation import generation_attention_baselines
from lightning_xai.callbacks._audit.aggregation import aggregate_values
from lightning_xai.callbacks._audit.failures import defined_examples
from lightning_xai.callbacks._audit.generation import (
    check_decoding,
    check_generation_methods,
    decoded_batch,
    is_generator_model,
)
from lightning_xai.callbacks._audit.model import refuse_non_softmax
from lightning_xai.callbacks._audit.replay import SharedReplay
from lightning_xai.callbacks.base import AuditCallback, AuditExample, AuditPrediction, BatchResult
from lightning_xai.metrics import summarize_values

__all__ = ["AttentionBaselines"]


#: a generator's per-example values (see the class docstring) and their labels in the final table
_GENERATION_ROWS = (
    ("log_prob_change", "Δ log p(target)"),
    ("log_prob_change_per_token", "Δ log p per token"),
    ("greedy_token_changed", "greedy tokens changed"),
)


class AttentionBaselines(SharedReplay, AuditCallback):
    """Permutation test (J&W 2019) and uniform-attention evaluation (W&P 2019) on a fixed audit subset.

    *Permutation*: for each audited example, ``num_permutations`` random permutations of the trained attention
    over its real tokens replace the attention (everything before it fixed); the output change is
    ``Δŷ = ½Σ|p − p'|`` (``|p₁ − p'₁|`` for two classes). Logged: the median over examples of each example's median
    ``Δŷ`` (``permutation/median_delta``) and the same per bin of maximum attention
    (``permutation/bin[lo,hi)/median_delta``, with the bin's ``count``).

    *Uniform*: the trained attention is replaced by ``1/L`` over real tokens; logged are accuracy and macro-F1 with
    trained and uniform attention, their delta (uniform − trained), the fraction of flipped decisions and the mean
    ``Δŷ``.

    Both compare softmax output distributions: a multi-label or regression model is refused at setup.

    **Generation** (Vashishth et al. 2019). On a text generator (a causal LM or encoder–decoder seen through
    :class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`) the explained output is the
    log-probability of the target (the batch's ``labels`` with ``decoding="force"``, the model's greedy output with
    ``decoding="free"``, teacher-forced). The attention rows of the explained target steps in the last layer
    (cross-attention of an encoder–decoder, the decoder self-attention of a causal LM), every head, are replaced by
    *uniform* attention over the source (prompt) tokens (each head keeps its own mass outside the source) and by
    ``num_permutations`` *permutations* of each step's row over the source tokens (one per step, shared by the
    heads; see :mod:`lightning_xai.audits.generation`). Per example, with ``Δ_k = log p'(y_k) − log p(y_k)`` over the
    explained steps ``k``:

    * ``uniform/log_prob_change``: ``Σ_k Δ_k``, the change of the target's log-probability;
    * ``uniform/log_prob_change_per_token``: ``mean_k Δ_k``; ``uniform/abs_log_prob_change_per_token``:
      ``mean_k |Δ_k|``;
    * ``uniform/greedy_token_changed``: the share of steps whose greedy (argmax) token changes;
    * ``permutation/...``: the same four, the log-probability changes as the median over the permutations (J&W's
      median), the token change as the mean over them.

    Each is logged as ``/mean`` and ``/std`` over the audited examples (e.g.
    ``attention_baselines/uniform/log_prob_change_per_token/mean``). There is no class, so no accuracy, F1 or
    maximum-attention bins on a generator.

    Args:
        num_permutations: permutations per example (J&W: 100).
        max_attention_bins: bin edges of the maximum attention weight.
        permutation / uniform: run either part.
        decoding: for a generator, ``"force"`` (the batch's ``labels``) or ``"free"`` (the model's greedy output).
        max_new_tokens: the longest greedy output free decoding explains.
        **kwargs: scheduling and subset options of :class:`~lightning_xai.callbacks.AuditCallback`.

    Example:
        >>> AttentionBaselines(num_permutations=0)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionBaselines(num_permutations) must be a positive int, got 0.
    """

    name = "attention_baselines"
    needs_attention_override = True  # the permuted and uniform attentions are fed back as overrides

    def __init__(
        self,
        num_permutations: int = 100,
        max_attention_bins: Sequence[float] = DEFAULT_MAX_ATTENTION_BINS,
        permutation: bool = True,
        uniform: bool = True,
        decoding: str = "force",
        max_new_tokens: int = 20,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_decoding("AttentionBaselines", decoding, max_new_tokens)
        if isinstance(num_permutations, bool) or not isinstance(num_permutations, int) or num_permutations < 1:
            raise MisconfigurationException(
                f"AttentionBaselines(num_permutations) must be a positive int, got {num_permutations!r}."
            )
        edges = list(max_attention_bins)
        if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])):
            raise MisconfigurationException(
                f"AttentionBaselines(max_attention_bins) must be increasing with at least two edges, got {edges}."
            )
        if not permutation and not uniform:
            raise MisconfigurationException("AttentionBaselines: enable permutation, uniform or both.")
        self.num_permutations = num_permutations
        self.max_attention_bins = edges
        self.permutation = permutation
        self.uniform = uniform
        self.decoding, self.max_new_tokens = decoding, max_new_tokens

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        model = self.explainable(pl_module)
        check_generation_methods("AttentionBaselines", model, [], decoding=self.decoding)
        if is_generator_model(model):
            if list(self.max_attention_bins) != list(DEFAULT_MAX_ATTENTION_BINS):
                raise MisconfigurationException(
                    "AttentionBaselines(max_attention_bins) bins a classifier's permutation Δŷ by its maximum "
                    f"attention; a generator's values ({type(getattr(model, 'model', model)).__name__}) are not "
                    "binned. Leave max_attention_bins at its default."
                )
            self.explained_quantity = "log-probability of the target sequence"
            return
        measure = "the permutation test" if self.permutation else "the uniform-attention evaluation"
        refuse_non_softmax("AttentionBaselines", model, measure)  # not at the first audit

    def audit_inputs(self, model: ExplainableModel, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The batch itself, or for ``decoding="free"`` the batch with the model's greedy output as its target."""
        return decoded_batch(model, batch, self.decoding, self.max_new_tokens)

    def _state_config(self) -> Dict[str, Any]:
        generation = {"decoding": self.decoding} if self.decoding != "force" else {}  # existing keys kept
        return dict(
            super()._state_config(),
            num_permutations=self.num_permutations,
            permutation=self.permutation,
            uniform=self.uniform,
            **generation,
        )

    def predict(self, model: ExplainableModel, batch: Dict[str, Any]) -> AuditPrediction:
        """The prediction step, read from the pass of the batch's override scorer, which the baselines then use
        (:class:`SharedReplay`; a text generator's baselines make no such scorer)."""
        if is_generator_model(model):
            return super().predict(model, batch)
        return self.replayed_prediction(model, batch)[0]

    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: List[int],
        prediction: Optional[AuditPrediction] = None,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        prediction = prediction or self.predict(model, batch)
        replay = self.replay_for(batch)
        values: Dict[str, torch.Tensor] = {}
        if is_generator_model(model):
            values.update(
                generation_attention_baselines(
                    model,
                    batch,
                    num_permutations=self.num_permutations,
                    row_generators=self.example_generators(indices),
                    permutation=self.permutation,
                    uniform=self.uniform,
                )
            )
            return BatchResult(maps={"attention": prediction.attention}, values=values), {}
        if replay is None:  # one pass and one checked scorer of overrides serve the prediction and both baselines
            with torch.no_grad():
                replay = override_scorer(model, model.embed(batch), batch)
        if self.permutation:
            result = permutation_test(
                model, batch, self.num_permutations, row_generators=self.example_generators(indices), replay=replay
            )
            values["permutation/median_delta"] = result.median_delta
            values["permutation/max_attention"] = result.max_attention
        if self.uniform:
            uni = uniform_attention_evaluation(model, batch, replay=replay)
            values["uniform/delta"] = uni["delta"]
            values["uniform/prediction"] = uni["uniform_pred"].double()
        return BatchResult(maps={"attention": prediction.attention}, values=values), {}

    def summary_rows(self, metrics: Mapping[str, float], full: bool = False) -> List[Tuple[str, str]]:
        """Rows of the final table: uniform-attention accuracy/F1/flips, the permutation median ``|Δŷ|`` overall
        and per maximum-attention bin.

        Example:
            >>> AttentionBaselines().summary_rows({"permutation/median_delta": 0.01})
            [('permutation: median |Δŷ|', '{permutation/median_delta:num4}')]
        """
        rows = [
            (f"{part} attention: {label}", f"{{{part}/{key}:mean_std}}")
            for part in ("uniform", "permutation")
            for key, label in _GENERATION_ROWS
            if f"{part}/{key}/mean" in metrics
        ]
        if "uniform/accuracy_delta" in metrics:
            rows.append(
                (
                    "uniform attention: accuracy trained → uniform",
                    "{uniform/accuracy_trained:num} → {uniform/accuracy_uniform:num} (Δ {uniform/accuracy_delta:+.3f})",
                )
            )
            rows.append(("uniform attention: macro-F1 delta", "{uniform/f1_delta:+.3f}"))
            rows.append(("uniform attention: decisions flipped", "{uniform/flip_fraction:num}"))
        if "permutation/median_delta" in metrics:
            rows.append(("permutation: median |Δŷ|", "{permutation/median_delta:num4}"))
            for key in metrics:
                count = key.replace("/median_delta", "/count")
                if key.startswith("permutation/bin") and key.endswith("/median_delta") and metrics.get(count):
                    label = key[len("permutation/bin") : -len("/median_delta")]
                    rows.append(
                        (f"permutation: median |Δŷ|, max attention in {label}", f"{{{key}:num4}} (n={{{count}:int}})")
                    )
        return rows

    def histogram_keys(self, examples: List[AuditExample]) -> List[str]:
        keys = (
            "permutation/median_delta",
            "uniform/delta",
            "permutation/log_prob_change_per_token",
            "uniform/log_prob_change_per_token",
        )
        return [k for k in keys if any(k in e.values for e in examples)]

    def aggregate(self, examples: List[AuditExample], extras: Dict[str, Any]) -> Dict[str, float]:
        out: Dict[str, float] = {}
        if not examples:
            return out
        if any("uniform/log_prob_change" in e.values or "permutation/log_prob_change" in e.values for e in examples):
            return aggregate_values(examples)  # a generator's: mean and std of every value (NaN ones left out)
        examples = defined_examples(examples)  # rows with non-finite logits have no prediction to compare
        if not examples:
            nan = float("nan")
            if self.permutation:
                out.update({"permutation/median_delta": nan, "permutation/mean_max_attention": nan})
            if self.uniform:
                out.update({"uniform/flip_fraction": nan, "uniform/mean_delta": nan})
            return out
        if self.permutation:
            delta = torch.tensor([e.values["permutation/median_delta"] for e in examples], dtype=torch.float64)
            peak = torch.tensor([e.values["permutation/max_attention"] for e in examples], dtype=torch.float64)
            out["permutation/median_delta"] = float(np.median(delta.numpy()))
            out["permutation/mean_max_attention"] = float(peak.mean())
            for name, stats in bin_by_max_attention(delta, peak, self.max_attention_bins).items():
                out[f"permutation/bin{name}/median_delta"] = stats["median"]
                out[f"permutation/bin{name}/count"] = float(stats["count"])
        if self.uniform:
            labelled = [e for e in examples if e.label is not None]
            if labelled:
                summary = uniform_attention_summary(
                    torch.tensor([e.prediction for e in labelled]),
                    torch.tensor([int(e.values["uniform/prediction"]) for e in labelled]),
                    torch.tensor([e.label for e in labelled]),
                )
                out.update({f"uniform/{k}": v for k, v in summary.items()})
            out["uniform/mean_delta"] = summarize_values([e.values["uniform/delta"] for e in examples])["mean"]
        return out

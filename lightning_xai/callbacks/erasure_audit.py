"""Erasure faithfulness while a model trains: Serrano & Smith's decision flips and ERASER's deletion metrics."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch import Tensor
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.attribution import ATTRIBUTION_METHODS, attribute
from lightning_xai.attribution.heads import explained_quantity
from lightning_xai.audits.erasure import decision_flip, ranking_scores
from lightning_xai.audits.generation_erasure import attention_row_gradient, generation_erasure
from lightning_xai.callbacks._audit.generation import (
    check_decoding,
    check_generation_methods,
    decoded_batch,
    is_generator_model,
)
from lightning_xai.callbacks._audit.model import refuse_regression_flips
from lightning_xai.callbacks._audit.options import check_names, check_options_of_methods
from lightning_xai.callbacks._audit.replay import SharedReplay
from lightning_xai.callbacks.base import AuditCallback, AuditExample, AuditPrediction, BatchResult
from lightning_xai.metrics.functional.faithfulness import erasure_scores

__all__ = ["ERASURE_RANKINGS", "ErasureAudit"]

#: the erasure audit's own rankings, by the name it logs them under -> the ranking of :mod:`lightning_xai.audits.erasure`
ERASURE_RANKINGS: Dict[str, str] = {
    "attention": "attention",
    "random": "random",
    "attention_gradient": "gradient",
    "grad_x_attention": "grad_x_attention",
}


def _is_size(value: Any) -> bool:
    """A top-k size: an int number of tokens >= 1 or a fraction in (0, 1] of the real tokens."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and value > 0
        and not (isinstance(value, float) and value > 1)
    )


class ErasureAudit(SharedReplay, AuditCallback):
    """Is the ranking an explanation gives faithful? Erase what it ranks first and watch the prediction.

    For every ranking of ``rankings`` and every example of the fixed audit subset:

    * **decision flip** (Serrano & Smith, 2019): with the encoder outputs fixed, zero the attention weights of the
      top-ranked tokens one at a time (renormalising the rest) until the argmax changes. Logged:
      ``<ranking>/flipped/mean`` (fraction of examples whose decision flips before one item is left),
      ``<ranking>/fraction_removed/mean`` and ``<ranking>/attention_removed/mean`` (over the flipped examples);
    * **ERASER** (DeYoung et al., 2020), deleting tokens: ``<ranking>/comprehensiveness`` and
      ``<ranking>/sufficiency`` at the top-``k`` tokens and, with ``aopc_bins``, their AOPC over those bins
      (``<ranking>/aopc_comprehensiveness``, ``<ranking>/aopc_sufficiency``).

    **Heads.** Erasure changes the score the model's head explains (the predicted class's probability, a
    multi-label model's top label's sigmoid, a regression model's output value: recorded with every audit as
    ``history[i]["explained_quantity"]``). A multi-label decision flips when its set of labels above 0.5 changes; a
    regression model makes no decision, so ``decision_flip=True`` is refused for it at setup (pass
    ``decision_flip=False``: comprehensiveness and sufficiency are then changes of the output value).

    AOPC is off by default: ERASER's five bins add three or four erasure sizes per ranking to the one at ``k``,
    which on MiniLM fine-tuning on SST-2 doubles the audit (5–6 % of a training epoch without AOPC, 10–12 % with it;
    benchmarks/README.md), and the default is meant to be left on. ``aopc_bins=AOPC_BINS``
    (:data:`~lightning_xai.metrics.functional.AOPC_BINS`: 1, 5, 10, 20, 50 %) turns on ERASER's AOPC.

    **Generation.** On a text generator (a causal LM or encoder–decoder seen through
    :class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`) the explained output is the target's
    log-probability ``log p(target | source) = Σ_k log p(y_k | y_<k, source)`` (the batch's ``labels`` with
    ``decoding="force"``, the model's greedy output with ``decoding="free"``; teacher-forced), and the rankings
    order the *source* (prompt) tokens; they are deleted (:mod:`lightning_xai.audits.generation_erasure`):

    * ``<ranking>/comprehensiveness`` / ``<ranking>/sufficiency``: the drop of the target's log-probability when the
      top-``k`` source tokens are deleted / kept alone (nats, Σ over the steps); ``..._per_token``: divided by the
      row's target steps; AOPC as above;
    * ``<ranking>/flipped``: whether the greedy (argmax) token of some explained step changes before one source
      token is left, deleting tokens in ranking order; ``<ranking>/fraction_removed`` and
      ``<ranking>/attention_removed`` (the mean step attention they carried) at that first change;
      ``<ranking>/steps_changed``: the share of explained steps whose greedy token changes with the top-``k``
      tokens deleted.

    ``"attention"`` is the mean of the steps' attention rows; ``"attention_gradient"`` the gradient of the target's
    log-probability w.r.t. the last layer's step rows summed over steps and heads, ``"grad_x_attention"`` the same
    weighted by the rows; attribution methods explain the target's log-probability (those that read a
    classifier's logits are refused at setup).

    Rankings: ``"attention"``, ``"random"``, ``"attention_gradient"`` (∂ logit / ∂α, Serrano & Smith's
    gradient w.r.t. the attention weights), ``"grad_x_attention"`` (α · ∂ logit / ∂α), or any other
    :func:`~lightning_xai.attribution.attribute` method name (its token map is the ranking, e.g.
    ``"integrated_gradients"``, ``"leave_one_out"``; ``"gradient"`` is ``attribute``'s ‖∂p/∂e‖, the embedding
    gradient).

    Args:
        rankings: the rankings compared.
        k: rationale size for comprehensiveness/sufficiency (int tokens or a fraction of the real tokens).
        aopc_bins: AOPC bins, ints (tokens) or fractions of the real tokens; empty (default): no AOPC. ERASER's
            are ``AOPC_BINS`` (1, 5, 10, 20, 50 %).
        decision_flip / eraser: run either part.
        method_options: per-ranking options for attribution-method rankings.
        decoding: for a generator, ``"force"`` (the batch's ``labels``) or ``"free"`` (the model's greedy output).
        max_new_tokens: the longest greedy output free decoding explains.
        **kwargs: scheduling and subset options of :class:`~lightning_xai.callbacks.AuditCallback`.

    Example:
        >>> ErasureAudit(rankings=("attention", "random"), k=1.5)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: ErasureAudit(k) must be an int >= 1 or a fraction in (0, 1], got 1.5.
    """

    name = "erasure_audit"
    precision_sensitive = True  # under autocast with precision="auto", erasure runs in float32

    def __init__(
        self,
        rankings: Sequence[str] = ("attention", "attention_gradient", "random"),
        k: Union[int, float] = 0.2,
        aopc_bins: Sequence[Union[int, float]] = (),
        decision_flip: bool = True,
        eraser: bool = True,
        method_options: Optional[Dict[str, Dict[str, Any]]] = None,
        decoding: str = "force",
        max_new_tokens: int = 20,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_decoding("ErasureAudit", decoding, max_new_tokens)
        self.decoding, self.max_new_tokens = decoding, max_new_tokens
        self.generation = False  # set at setup: the model is a text generator
        if isinstance(rankings, str):
            raise MisconfigurationException("ErasureAudit(rankings) is a list of names, not a string.")
        rankings = [str(r) for r in rankings]
        if not rankings or len(set(rankings)) != len(rankings):
            raise MisconfigurationException(f"ErasureAudit(rankings) must be non-empty and distinct, got {rankings}.")
        check_names(
            "ErasureAudit",
            "ranking",
            rankings,
            [*ERASURE_RANKINGS, *ATTRIBUTION_METHODS],
            f" (the erasure rankings {list(ERASURE_RANKINGS)} or an attribution method)",
        )
        if not _is_size(k):
            raise MisconfigurationException(f"ErasureAudit(k) must be an int >= 1 or a fraction in (0, 1], got {k!r}.")
        if isinstance(aopc_bins, (str, int, float)):
            raise MisconfigurationException(
                f"ErasureAudit(aopc_bins) is a list of sizes, got {aopc_bins!r}; e.g. "
                "aopc_bins=AOPC_BINS (lightning_xai.metrics.functional)."
            )
        bins = list(aopc_bins)
        bad = [b for b in bins if not _is_size(b)]
        if bad:
            raise MisconfigurationException(
                f"ErasureAudit(aopc_bins) must hold ints >= 1 or fractions in (0, 1], got {bad}."
            )
        if not decision_flip and not eraser:
            raise MisconfigurationException("ErasureAudit: enable decision_flip, eraser or both.")
        self.rankings = rankings
        self.k = k
        self.aopc_bins = bins
        self.decision_flip = decision_flip
        self.eraser = eraser
        # decision flips renormalise the attention and feed it back; ∂logit/∂α needs the override too
        self.needs_attention_override = decision_flip or "attention_gradient" in rankings
        self.method_options = dict(method_options or {})
        stray = sorted(set(self.method_options) - set(rankings))
        if stray:
            raise MisconfigurationException(
                f"ErasureAudit: method_options for {stray}, which are not in rankings {rankings}."
            )
        check_options_of_methods("ErasureAudit", self.method_options)

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        model = self.explainable(pl_module)
        check_generation_methods(
            "ErasureAudit", model, [r for r in self.rankings if r not in ERASURE_RANKINGS], decoding=self.decoding
        )
        self.generation = is_generator_model(model)
        if self.generation:
            self.explained_quantity = "log-probability of the target sequence"
            return
        if self.decision_flip:
            refuse_regression_flips("ErasureAudit", model)
        self.explained_quantity = explained_quantity(model)  # what comprehensiveness and sufficiency change

    def audit_inputs(self, model: ExplainableModel, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The batch itself, or for ``decoding="free"`` the batch with the model's greedy output as its target."""
        return decoded_batch(model, batch, self.decoding, self.max_new_tokens)

    def _state_config(self) -> Dict[str, Any]:
        config = dict(super()._state_config(), rankings=tuple(self.rankings), k=self.k)
        if self.aopc_bins:  # only when set: the state keys of audits without AOPC stay what they were
            config["aopc_bins"] = tuple(self.aopc_bins)
        if self.decoding != "force":
            config["decoding"] = self.decoding
        return config

    @override
    def attribution_methods(self) -> List[str]:
        return [r for r in self.rankings if r not in ERASURE_RANKINGS]  # the rankings that are attribution methods

    def expected_values(self) -> List[str]:
        """Every ranking's flip and ERASER values: NaN for undefined examples, never silently missing."""
        per_token = ("comprehensiveness_per_token", "sufficiency_per_token") if self.generation else ()
        names = (
            (("flipped", "fraction_removed", "attention_removed") if self.decision_flip else ())
            + (("steps_changed",) if self.decision_flip and self.generation else ())
            + (("comprehensiveness", "sufficiency", *per_token) if self.eraser else ())
            + (("aopc_comprehensiveness", "aopc_sufficiency") if self.eraser and self.aopc_bins else ())
        )
        return [f"{r}/{n}" for r in self.rankings for n in names]

    def _scores(self, model: ExplainableModel, batch: Dict[str, Any], ranking: str, indices: List[int]) -> Tensor:
        if ranking == "random":
            # per-example draws over the real tokens: the same ranking however the subset is batched or sharded
            mask = model.token_mask(batch)
            scores = torch.zeros(mask.shape)
            for row, gen in enumerate(self.example_generators(indices)):
                real = mask[row].cpu().nonzero().flatten()
                scores[row, real] = torch.rand(real.numel(), generator=gen)
            return scores.to(mask.device)
        if ranking in ERASURE_RANKINGS:
            return ranking_scores(model, batch, ERASURE_RANKINGS[ranking])
        return attribute(model, batch, ranking, **self.method_options.get(ranking, {})).detach()

    def predict(self, model: ExplainableModel, batch: Dict[str, Any]) -> AuditPrediction:
        """The prediction step; with decision flips (and the precision of the flips that of this step), read from
        the pass of the batch's override scorer, which the flips then use (:class:`SharedReplay`)."""
        if not self.decision_flip or is_generator_model(model) or self._precision.switches(self.precision_sensitive):
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
        if is_generator_model(model):
            return self._audit_generation(model, batch, indices, prediction), {}
        maps: Dict[str, Tensor] = {"attention": prediction.attention}
        values: Dict[str, Tensor] = {}
        ks = [self.k, *self.aopc_bins]
        # the flips of all rankings share one pass (the model's own rankings are read from it), and the erasures of
        # all rankings another
        entries = [
            ERASURE_RANKINGS[r]
            if r in ERASURE_RANKINGS and r != "random"
            else self._scores(model, batch, r, indices).float()
            for r in self.rankings
        ]
        logits = None
        if self.decision_flip:
            result = decision_flip(model, batch, entries, replay=replay)
            assert result.scores is not None  # decision_flip always returns the maps it ranked by
            stack, logits = result.scores.float(), result.logits
            for i, ranking in enumerate(self.rankings):
                flipped = result.flipped[i]
                nan = torch.full_like(result.fraction_removed[i], float("nan"), dtype=torch.float64)
                values[f"{ranking}/flipped"] = flipped.double()
                values[f"{ranking}/fraction_removed"] = torch.where(flipped, result.fraction_removed[i].double(), nan)
                values[f"{ranking}/attention_removed"] = torch.where(flipped, result.attention_removed[i].double(), nan)
        else:
            stack = torch.stack(
                [
                    self._scores(model, batch, r, indices).float() if isinstance(e, str) else e
                    for r, e in zip(self.rankings, entries)
                ]
            )
        maps.update((r, stack[i]) for i, r in enumerate(self.rankings) if r != "random")
        if self.eraser:
            comp, suff = erasure_scores(model, batch, stack, ks, logits=logits)  # the flips' full pass, reused
            for i, ranking in enumerate(self.rankings):
                values[f"{ranking}/comprehensiveness"] = comp[i, 0].double()
                values[f"{ranking}/sufficiency"] = suff[i, 0].double()
                if self.aopc_bins:
                    values[f"{ranking}/aopc_comprehensiveness"] = comp[i, 1:].double().mean(0)
                    values[f"{ranking}/aopc_sufficiency"] = suff[i, 1:].double().mean(0)
        return BatchResult(maps=maps, values=values), {}

    def _audit_generation(
        self, model: ExplainableModel, batch: Dict[str, Any], indices: List[int], prediction: AuditPrediction
    ) -> BatchResult:
        """A generator's erasure (see the class docstring): every ranking of the source tokens, one stack."""
        gradients: Optional[Tuple[Tensor, Tensor]] = None
        stack = []
        for ranking in self.rankings:
            if ranking == "attention":
                stack.append(prediction.attention)
            elif ranking in ("attention_gradient", "grad_x_attention"):
                gradients = gradients or attention_row_gradient(model, batch)
                stack.append(gradients[ranking == "grad_x_attention"].float())
            else:
                stack.append(self._scores(model, batch, ranking, indices).float())
        scores = torch.stack([s.to(prediction.attention.device) for s in stack])
        found = generation_erasure(
            model,
            batch,
            scores,
            [self.k, *self.aopc_bins],
            attention=prediction.attention,
            decision_flip=self.decision_flip,
            eraser=self.eraser,
        )
        values: Dict[str, Tensor] = {}
        for i, ranking in enumerate(self.rankings):
            for name, value in found.items():
                if value.dim() == 2:  # [R, B]: flips
                    values[f"{ranking}/{name}"] = value[i]
                else:  # [R, len(ks), B]: the erasure at k, and the AOPC over the bins
                    values[f"{ranking}/{name}"] = value[i, 0]
                    if self.aopc_bins and name in ("comprehensiveness", "sufficiency"):
                        values[f"{ranking}/aopc_{name}"] = value[i, 1:].mean(0)
        maps = {
            "attention": prediction.attention,
            **{r: scores[i] for i, r in enumerate(self.rankings) if r not in ("random", "attention")},
        }
        return BatchResult(maps=maps, values=values)

    def summary_rows(self, metrics: Mapping[str, float], full: bool = False) -> List[Tuple[str, str]]:
        """Rows of the final table: decision flips, comprehensiveness and sufficiency per ranking (and their AOPC
        with ``full``).

        Example:
            >>> ErasureAudit(rankings=("attention",), eraser=False).summary_rows({"attention/flipped/mean": 0.25})
            [('decision flip [attention]: fraction flipped', '{attention/flipped/mean:num}'), ('decision flip [attention]: fraction of tokens removed', '{attention/fraction_removed:mean_std}')]
        """
        rows = []
        names = (
            "comprehensiveness",
            "sufficiency",
            "comprehensiveness_per_token",
            "sufficiency_per_token",
            "steps_changed",
        ) + (("aopc_comprehensiveness", "aopc_sufficiency") if full else ())
        for r in self.rankings:
            if f"{r}/flipped/mean" in metrics:
                rows.append((f"decision flip [{r}]: fraction flipped", f"{{{r}/flipped/mean:num}}"))
                rows.append((f"decision flip [{r}]: fraction of tokens removed", f"{{{r}/fraction_removed:mean_std}}"))
            rows.extend(
                (f"{name.replace('_', ' ')} [{r}]", f"{{{r}/{name}:mean_std}}")
                for name in names
                if f"{r}/{name}/mean" in metrics
            )
        return rows

    def histogram_keys(self, examples: List[AuditExample]) -> List[str]:
        key = "fraction_removed" if self.decision_flip else "comprehensiveness"
        return [f"{r}/{key}" for r in self.rankings]

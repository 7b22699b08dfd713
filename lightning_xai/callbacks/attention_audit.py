"""Agreement between attention and saliency maps (Jain & Wallace, 2019), tracked while a model trains."""

from __future__ import annotations

import itertools
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_info
from torch import Tensor
from typing_extensions import override

from lightning_xai.adapters.capabilities import DeletionLogits
from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.attribution import attribute, method_record, shared_input_gradients
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.attribution.heads import explained_quantity
from lightning_xai.callbacks._audit.agreement_options import check_agreement_options
from lightning_xai.callbacks._audit.generation import (
    check_decoding,
    check_generation_methods,
    decoded_batch,
    is_generator_model,
    method_step_maps,
    per_step_agreement,
    place_rows,
)
from lightning_xai.callbacks._audit.pairs import DEFAULT_TOP_PAIRS
from lightning_xai.callbacks.base import AuditCallback, AuditPrediction, AuditResult, BatchResult
from lightning_xai.metrics.registry import AGREEMENT_METRICS, metric_label

__all__ = [
    "AttentionAudit",
    "AGREEMENT_METRICS",
    "DEFAULT_GRADIENT_METHODS",
    "DEFAULT_METHODS",
    "DEFAULT_METHOD_OPTIONS",
]


#: Jain & Wallace's maps. Integrated Gradients is one argument away (``methods=(*DEFAULT_METHODS,
#: "integrated_gradients")``) but not a default: on 256 SST-2 sentences it needs 256 × 29–52 forward+backward passes,
#: about a fifth (``n_steps="auto"``) of a reference-model training epoch on 2 CPU cores (benchmarks/README.md),
#: against ~4% for these three.
DEFAULT_METHODS: Tuple[str, ...] = ("gradient", "grad_x_input", "leave_one_out")
#: The default for a model that cannot score token deletions itself (no
#: :class:`~lightning_xai.adapters.capabilities.DeletionLogits`: every transformer): leave-one-out would re-run
#: Σ L_i shortened sentences per audit — on MiniLM fine-tuning that floor alone is ~5% of an SST-2 epoch at 256
#: sentences, against ~2% for these two (benchmarks/README.md, "Audit share"). Name it in ``methods`` to include it.
DEFAULT_GRADIENT_METHODS: Tuple[str, ...] = ("gradient", "grad_x_input")
#: Options the audit gives a method unless ``method_options`` says otherwise. Attention is non-negative, so agreement
#: with it compares magnitudes: Jain & Wallace (2019, §3) define grad×input importance as |Σ_d ∂y/∂e_td · e_td|
#: (``absolute=True``); the signed map ranks strongly negative tokens last and gives negative τ against attention.
#: The signed map stays available: ``method_options={"grad_x_input": {"absolute": False}}``.
DEFAULT_METHOD_OPTIONS: Dict[str, Dict[str, Any]] = {"grad_x_input": {"absolute": True}}


def pair_name(first: str, second: str) -> str:
    """The logged name of a pair of maps, e.g. ``attention_vs_gradient``."""
    return f"{first}_vs_{second}"


class AttentionAudit(AuditCallback):
    """Agreement of attention with saliency maps — and of the saliency maps with each other — on a fixed subset.

    At every audit, for each example of the audit subset it computes the model's attention and each saliency map
    of ``methods`` (via :func:`lightning_xai.attribution.attribute`, explaining the predicted class), then every
    metric of ``metrics`` for every pair of maps (attention↔method and method↔method, e.g. gradient↔LOO as
    Jain & Wallace report). Logged per pair and metric: ``mean`` and ``std`` over examples (NaN instances, e.g. τ
    of a one-token text, left out) and, for correlations with a p-value, the ``significant_fraction`` (p ≤ 0.05).
    Keys look like ``attention_audit/kendall_tau/attention_vs_gradient/mean``.

    When the audited batches carry an impermissible-token mask (batch key ``impermissible_key``, bool ``[B, T]``,
    e.g. the bundled ``sst_wiki``/``pronoun``/``occupation`` data of Pruthi et al.), every map — attention and
    each method — also gets its *impermissible share*: the fraction of its ``|score|`` over the real tokens that
    falls on impermissible tokens, Σ_{i∈I}|s_i| / Σ_i|s_i| (0 for an example without impermissible tokens, NaN —
    left out — for an all-zero map). Logged as ``attention_audit/impermissible_share/<map>/mean`` (and ``/std``)
    over the audited examples. A deceptive model (Pruthi et al., 2020) drives the attention's share to ~0 while
    gradient or leave-one-out shares stay high: saliency still sees the tokens the model uses.

    **Generation.** On a generator (a ``transformers`` causal LM or encoder–decoder the module holds, seen through
    :class:`~lightning_xai.adapters.huggingface.HuggingFaceGenerationAdapter`) the maps are over the *source* tokens
    (the encoder input, a causal LM's prompt) and explain the log-probability of the whole target,
    ``Σ_k log p(y_k | y_<k, source)``; the attention is the mean of the target steps' attention rows (cross-attention
    of an encoder–decoder). Batches carry the target as ``labels`` (``[B, T]`` aligned with ``input_ids`` for a causal
    LM, ``[B, S]`` for an encoder–decoder; -100 where nothing is explained). ``decoding="force"`` (default) explains
    those labels; ``decoding="free"`` the model's own greedy output (up to ``max_new_tokens`` tokens), decoded anew
    at every audit. ``per_step=True`` also compares each target step's attention row with each method's map of that
    step's log-probability, over the ``(example, step)`` pairs that exist; an example's value is the mean over its
    steps, logged under ``per_step/``: ``attention_audit/per_step/kendall_tau/attention_vs_gradient/mean`` (no
    p-values). Methods that read a classifier's ``[B, C]`` logits (``lrp``, ``attnlrp``, ``integrated_hessians``,
    the context-mixing methods) are refused at setup. An example's ``label`` is ``None``, its ``prediction`` -1 and
    its ``probability`` that of the whole target; its ``maps`` are over the source tokens. The examples a report
    shows first (``step_examples``) also keep their target tokens and per-step maps (``AuditExample.step_maps``:
    attention's row and each method's map of every target step, over the source tokens; computed for those rows
    only, unless ``per_step`` computes them for all), which :class:`~lightning_xai.reporting.AuditReport` draws as
    source tokens × target tokens heatmaps.

    **Heads.** The maps explain what the model's head computes (``target=None``): the predicted class's softmax
    probability, a multi-label model's top label's sigmoid, a regression model's output value (whose examples have
    ``prediction`` -1 and the value as ``probability``). The quantity, in words, is recorded with every audit
    (``history[i]["explained_quantity"]``, ``latest.explained_quantity``).

    Args:
        methods: attribution methods compared with attention (any name :func:`~lightning_xai.attribution.attribute`
            accepts). ``None`` (default) picks them at setup from the model: Jain & Wallace's gradient,
            grad×input and leave-one-out (:data:`DEFAULT_METHODS`) when the model scores token deletions itself
            (the :class:`~lightning_xai.adapters.capabilities.DeletionLogits` capability, e.g. the reference
            BiLSTM: ~4% of its SST-2 epoch for 256 sentences), gradient and grad×input
            (:data:`DEFAULT_GRADIENT_METHODS`) otherwise — transformers, where leave-one-out's Σ L_i forward
            passes alone cost ~5% of a MiniLM epoch — unless ``pairs`` or ``method_options`` name leave-one-out;
            the choice is logged once. Add ``"integrated_gradients"`` (with
            ``method_options={"integrated_gradients": {"n_steps": "auto"}}`` for its adaptive quadrature) when
            the cost — roughly 256 × 26 extra forward+backward passes per audit — is worth it. A method whose
            ``attribute`` returns a tuple (``integrated_hessians``: row sums and Γ; ``integrated_gradients`` with
            ``return_convergence_delta=True``) is compared through its first element, the ``[B, T]`` map; the
            ``[B, T, T]`` interactions of a method registered with ``returns="pairwise_interactions"`` (Integrated
            Hessians' Γ) also give the report its strongest token pairs (``top_pairs``).
        metrics: agreement metrics of :mod:`lightning_xai.metrics.registry`: ``kendall_tau`` (τ-b, J&W),
            ``topk_kendall_tau``, ``spearman``, ``pearson``, ``jsd`` (maps as distributions of ``|score|``),
            ``topk_overlap``, or any name registered with ``register_agreement_metric``.
        pairs: which pairs to compare, as ``("attention", "gradient")`` tuples; default every pair.
        method_options: per-method keyword options for ``attribute``, e.g.
            ``{"integrated_gradients": {"n_steps": 20}}``, over :data:`DEFAULT_METHOD_OPTIONS`: ``grad_x_input`` is
            compared as Jain & Wallace's magnitude |Σ_d g·e| unless ``{"grad_x_input": {"absolute": False}}``.
        metric_options: per-metric keyword options, e.g. ``{"topk_overlap": {"k": 0.2}}``.
        impermissible_key: batch key of the impermissible-token mask; the shares are computed for batches that
            have it (``None``: never).
        top_pairs: with ``"integrated_hessians"`` in ``methods``, each example the report shows (see
            ``num_report_examples``) keeps its ``top_pairs`` strongest token pairs i ≠ j by ``|Γ_ij|`` and Γ over
            their tokens (:class:`~lightning_xai.callbacks._audit.results.TokenPairs`), drawn by
            :class:`~lightning_xai.reporting.AuditReport` as a heatmap; ``0``: none kept. Nothing is computed
            for it beyond Integrated Hessians itself.
        decoding: for a generator, ``"force"`` (explain the batch's ``labels``) or ``"free"`` (explain the model's
            greedy output); a classifier takes only ``"force"``.
        max_new_tokens: the longest greedy output free decoding explains.
        per_step: for a generator, also compare the maps of every target step (see above).
        step_examples: for a generator, how many of the report's examples (the first of the audit subset, at most
            ``num_report_examples``) keep their per-step maps and target tokens (``AuditExample.step_maps``). Their
            cost does not grow with ``num_samples`` but with the target's length: ``attribute(..., target="steps")``
            runs one backward pass per target step and method on these rows (free with ``per_step=True``).
        **kwargs: scheduling and subset options of :class:`~lightning_xai.callbacks.AuditCallback`
            (``every_n_epochs=1``, ``every_n_train_steps=None``, ``num_samples=256``, ``dataloader="val"``,
            ``seed=0``, ...).

    Example:
        >>> audit = AttentionAudit(methods=("gradient", "leave_one_out"), metrics=("kendall_tau",))
        >>> audit.pairs
        [('attention', 'gradient'), ('attention', 'leave_one_out'), ('gradient', 'leave_one_out')]
        >>> AttentionAudit(metrics=("kendal",))
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: AttentionAudit: unknown metric 'kendal'; choose from ['jsd', 'kendall_tau', 'pearson', 'spearman', 'topk_kendall_tau', 'topk_overlap'] (or register one with lightning_xai.metrics.registry.register_agreement_metric).
    """

    name = "attention_audit"

    def __init__(
        self,
        methods: Optional[Sequence[str]] = None,
        metrics: Sequence[str] = ("kendall_tau", "jsd", "topk_overlap"),
        pairs: Optional[Sequence[Sequence[str]]] = None,
        method_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
        metric_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
        impermissible_key: Optional[str] = "impermissible",
        top_pairs: int = DEFAULT_TOP_PAIRS,
        decoding: str = "force",
        max_new_tokens: int = 20,
        per_step: bool = False,
        step_examples: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_decoding("AttentionAudit", decoding, max_new_tokens)
        if not isinstance(per_step, bool):
            raise MisconfigurationException(f"AttentionAudit(per_step) must be a bool, got {per_step!r}.")
        self._auto_methods = methods is None
        methods, resolved, self._requested_pairs, method_options, metric_options = check_agreement_options(
            DEFAULT_METHODS if methods is None else methods,
            metrics,
            pairs,
            method_options,
            metric_options,
            impermissible_key=impermissible_key,
            counts={"top_pairs": top_pairs, "step_examples": step_examples},
        )
        self.metrics = resolved
        self._use_methods(methods)
        self.method_options = method_options
        self.metric_options = metric_options
        self.impermissible_key = impermissible_key
        self.top_pairs = top_pairs
        self.decoding, self.max_new_tokens, self.per_step = decoding, max_new_tokens, per_step
        self.step_examples = step_examples
        self._audited_split: Optional[str] = None

    def _use_methods(self, methods: Sequence[str]) -> None:
        self.methods = list(methods)
        pairs = (
            itertools.combinations(["attention", *self.methods], 2)
            if self._requested_pairs is None
            else self._requested_pairs
        )
        self.pairs: List[Tuple[str, str]] = [(first, second) for first, second in pairs]

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        model = self.explainable(pl_module)
        check_generation_methods("AttentionAudit", model, self.methods, decoding=self.decoding, per_step=self.per_step)
        self.explained_quantity = (
            "log-probability of the target sequence" if is_generator_model(model) else explained_quantity(model)
        )  # recorded with every audit (history, latest)
        if not self._auto_methods:
            return
        named = {m for pair in self._requested_pairs or () for m in pair} | set(self.method_options)
        if isinstance(model, DeletionLogits) or "leave_one_out" in named:
            chosen = DEFAULT_METHODS
        else:
            chosen = DEFAULT_GRADIENT_METHODS
            rank_zero_info(
                f"AttentionAudit: methods={list(chosen)} (the default for a model without a deletion fast "
                "path: leave-one-out would re-run every audited sentence once per token). Pass "
                "methods=('gradient', 'grad_x_input', 'leave_one_out') to include it."
            )
        self._use_methods(chosen)

    def audit_inputs(self, model: ExplainableModel, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The batch itself, or for ``decoding="free"`` the batch with the model's greedy output as its target."""
        return decoded_batch(model, batch, self.decoding, self.max_new_tokens)

    def _state_config(self) -> Dict[str, Any]:
        methods = "auto" if self._auto_methods else tuple(self.methods)  # the same key before and after setup
        generation = {
            k: v
            for k, v, default in (("decoding", self.decoding, "force"), ("per_step", self.per_step, False))
            if v != default
        }  # only when not the defaults: existing checkpoints keep their keys
        return dict(super()._state_config(), methods=methods, metrics=tuple(self.metrics), **generation)

    @override
    def attribution_methods(self) -> List[str]:
        return [m for m in self.methods if isinstance(m, str)]

    def expected_values(self) -> List[str]:
        """Every pair's metric (and p-value): NaN for undefined examples, so no metric silently disappears."""
        names = []
        for (first, second), metric in itertools.product(self.pairs, self.metrics):
            key = f"{metric}/{pair_name(first, second)}"
            names += [key, f"{key}/p_value"] if AGREEMENT_METRICS[metric][1] else [key]
            if self.per_step:
                names.append(f"per_step/{key}")
        return names

    def summary_rows(self, metrics: Mapping[str, float], full: bool = False) -> List[Tuple[str, str]]:
        """Rows of the final table (``lightning_xai.reporting.final_results``): the first metric (Kendall τ by
        default, as J&W report) of every pair, every metric with ``full``.

        Example:
            >>> AttentionAudit(methods=("gradient",)).summary_rows({"kendall_tau/attention_vs_gradient/mean": 0.3})
            [('Kendall τ attention ↔ gradient', '{kendall_tau/attention_vs_gradient:mean_std}')]
        """
        rows = []
        for metric in self.metrics[: None if full else 1]:
            label = metric_label(metric)
            for first, second in self.pairs:
                key = f"{metric}/{pair_name(first, second)}"
                if f"{key}/mean" in metrics:
                    rows.append((f"{label} {first} ↔ {second}", f"{{{key}:mean_std}}"))
        return rows

    def histogram_keys(self, examples: List[Any]) -> List[str]:
        """The agreement histogram: the first metric (Kendall τ by default) of every pair."""
        return [f"{self.metrics[0]}/{pair_name(a, b)}" for a, b in self.pairs]

    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: List[int],
        prediction: Optional[AuditPrediction] = None,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        prediction = prediction or self.predict(model, batch)
        mask = model.token_mask(batch)
        maps: Dict[str, Tensor] = {"attention": prediction.attention}
        found: Dict[str, Any] = {}
        with shared_input_gradients():  # gradient and grad×input: one backward pass between them
            for method in self.methods:
                with self.map_precision(method):  # float32 for leave-one-out, IG under autocast ("auto")
                    options = {**DEFAULT_METHOD_OPTIONS.get(method, {}), **self.method_options.get(method, {})}
                    scores = attribute(model, batch, method, target=None, **options)
                if isinstance(scores, tuple):  # (map [B, T], extra): a convergence delta, pairwise interactions
                    if method_record(method).has_interactions and self.top_pairs:  # the report's strongest pairs
                        found.update(
                            interactions=scores[1].detach().float(),
                            interaction_pairs=self.top_pairs,
                            interaction_method=method,
                        )
                    scores = scores[0]
                maps[method] = scores.detach().float()
        values: Dict[str, Tensor] = {}
        if is_generator_model(model):
            found.update(self._generator_steps(model, batch, prediction, mask, indices, values))
        for first, second in self.pairs:
            for metric in self.metrics:
                fn, has_p = AGREEMENT_METRICS[metric]
                result = fn(maps[first], maps[second], mask, **self.metric_options.get(metric, {}))
                key = f"{metric}/{pair_name(first, second)}"
                if has_p:
                    values[key], values[f"{key}/p_value"] = result
                else:
                    values[key] = result
        if self.impermissible_key is not None and self.impermissible_key in batch:
            impermissible = batch[self.impermissible_key]
            if (
                not isinstance(impermissible, Tensor)
                or impermissible.dtype != torch.bool
                or impermissible.shape != mask.shape
            ):
                got = tuple(impermissible.shape) if isinstance(impermissible, Tensor) else type(impermissible)
                raise MisconfigurationException(
                    f"AttentionAudit: batch[{self.impermissible_key!r}] must be a bool tensor shaped like the token "
                    f"mask {tuple(mask.shape)}, got {getattr(impermissible, 'dtype', None)} {got}; fix the "
                    "collate function or set impermissible_key=None."
                )
            real = mask.to(maps["attention"].device).double()
            inside = impermissible.to(real.device).double() * real
            for name, scores in maps.items():
                magnitude = scores.double().abs() * real
                total = magnitude.sum(-1)
                share = (magnitude * inside).sum(-1) / total
                values[f"impermissible_share/{name}"] = torch.where(total > 0, share, torch.full_like(share, math.nan))
        return BatchResult(maps=maps, values=values, **found), {}

    @override
    def run_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str) -> AuditResult:
        self._audited_split = split  # which subset's first num_report_examples keep their step maps
        return super().run_audit(trainer, pl_module, stage, split)

    def _step_rows(self, indices: Sequence[int]) -> List[int]:
        """The rows of a batch (its dataset ``indices``) that keep their step maps: the first ``step_examples`` (at
        most ``num_report_examples``) of the audit subset being audited (none outside :meth:`run_audit`)."""
        split, count = self._audited_split, min(self.step_examples, self.num_report_examples)
        shown = set(self._subsets.indices.get(split, [])[:count]) if split else set()
        return [row for row, index in enumerate(indices) if index in shown]

    def _step_maps(
        self, model: ExplainableModel, batch: Dict[str, Any], attention: Tensor, steps: Tensor
    ) -> Dict[str, Tensor]:
        """``{map: [B, K, T]}``: ``attention`` (each step's row) and each method's map of each step's log-probability
        (:func:`~lightning_xai.callbacks._audit.generation.method_step_maps`)."""
        maps = method_step_maps(model, batch, steps, self.methods, self._method_options, self.map_precision)
        return {"attention": attention.detach().float(), **maps}

    def _method_options(self, method: str) -> Dict[str, Any]:
        return {**DEFAULT_METHOD_OPTIONS.get(method, {}), **self.method_options.get(method, {})}

    def _generator_steps(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        prediction: AuditPrediction,
        mask: Tensor,
        indices: Sequence[int],
        values: Dict[str, Tensor],
    ) -> Dict[str, Any]:
        """A generator's per-step maps: with ``per_step``, of every row, compared into ``values`` (``per_step/
        <metric>/<pair>`` ``[B]``: every pair's metric over each row's target steps, see the class); otherwise of
        the rows that keep them only (``step_examples``). Returns the :class:`BatchResult` fields that keep them."""
        out = prediction.output
        attention, steps = out.extras["step_attention"], out.target_steps
        rows = torch.tensor(self._step_rows(indices), dtype=torch.long, device=steps.device)
        if self.per_step:
            step_maps = self._step_maps(model, batch, attention, steps)
            metrics = {metric: AGREEMENT_METRICS[metric][0] for metric in self.metrics}
            found = per_step_agreement(step_maps, steps, mask, self.pairs, metrics, self.metric_options)
            values.update({f"per_step/{key}": value for key, value in found.items()})
            return {"step_maps": step_maps, "step_mask": place_rows(steps[rows], rows, steps.shape)}
        if not rows.numel():
            return {}
        shown = self._step_maps(model, gather_rows(batch, rows, len(indices)), attention[rows], steps[rows])
        return {
            "step_maps": {k: place_rows(v, rows, attention.shape) for k, v in shown.items()},
            "step_mask": place_rows(steps[rows], rows, steps.shape),
        }

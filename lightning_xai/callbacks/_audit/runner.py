"""How an audit runs, from the fixed subset to its result: which examples this process audits (the subset's size,
its indices drawn once, this process's batches), the check of the model before the first audit, the pass over the
batches (each on the module's device, inside the audit's guard, lockstep and precision: the prediction step, then
``audit_batch`` on the rows with finite logits) and the result (gathered across processes, aggregated, checked for
undefined values, logged).

What an audit measures is not known here: :class:`AuditHooks` is what a run asks of its callback, the hooks a
subclass of :class:`~lightning_xai.callbacks.AuditCallback` overrides. The callback owns an :class:`AuditRunner`
(as it owns its budget, subsets and schedule) and keeps what the runs produce (``history``, ``latest``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol, Set, Tuple

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device

from lightning_xai.adapters.capabilities import head_kind_of
from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.adapters.sharding import lockstep
from lightning_xai.attribution.heads import default_output
from lightning_xai.callbacks._audit import model as lookup
from lightning_xai.callbacks._audit.aggregation import AuditCollector, value_names
from lightning_xai.callbacks._audit.budget import AuditBudget
from lightning_xai.callbacks._audit.distributed import (
    gather_examples,
    merge_extras,
    refuse_unshardable,
    replicated,
    shared_failure,
)
from lightning_xai.callbacks._audit.failures import audit_finite_rows, warn_undefined, with_prediction
from lightning_xai.callbacks._audit.guard import AuditPrecision, audit_guard, precision_context
from lightning_xai.callbacks._audit.output import RunCounter, audit_progress
from lightning_xai.callbacks._audit.results import AuditExample, AuditPrediction, AuditResult, BatchResult
from lightning_xai.callbacks._audit.schedule import Log, subset_size
from lightning_xai.callbacks._audit.subset import AUDIT_TOKEN_BUDGET, AuditBatch, AuditSubsets, find_loader, join_budget

__all__ = ["AuditHooks", "AuditRunner", "shared_prediction"]


def shared_prediction(model: ExplainableModel, batch: Dict[str, Any]) -> AuditPrediction:
    """The prediction step every audit shares, unless its callback overrides ``predict``: the protocol's forward
    pass (no gradients), read through the model's head (:meth:`AuditPrediction.from_output`: softmax and argmax
    for a classifier)."""
    with torch.no_grad():
        out = model.forward_from_embeddings(model.embed(batch), batch)
    return AuditPrediction.from_output(out, head_kind_of(model), default_output(model))


class AuditHooks(Protocol):
    """What a run asks of its audit callback: the settings it reads and the hooks a subclass overrides (see
    :class:`~lightning_xai.callbacks.AuditCallback`, which has them all)."""

    name: str
    precision_sensitive: bool
    needs_attention_override: bool
    explained_quantity: Optional[str]
    seed: int
    batch_size: Optional[int]
    num_report_examples: int

    def explainable(self, pl_module: Any) -> ExplainableModel:
        """The module seen through the protocol."""

    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """The check before the first audit."""

    def attribution_methods(self) -> List[str]:
        """The registered attribution methods the audit runs."""

    def audit_indices(self, trainer: "pl.Trainer", split: str) -> List[int]:
        """The fixed audit subset of ``split``."""

    def audit_inputs(self, model: ExplainableModel, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The batch the audit explains, made from an audited batch."""

    def predict(self, model: ExplainableModel, batch: Dict[str, Any]) -> AuditPrediction:
        """The prediction step every audit shares."""

    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: List[int],
        prediction: Optional[AuditPrediction] = None,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        """Measure one batch: ``(found, extra)``."""

    def expected_values(self) -> List[str]:
        """Per-example value names the audit always reports."""

    def aggregate(self, examples: List[AuditExample], extras: Dict[str, Any]) -> Dict[str, float]:
        """Scalars to log from every audited example."""


class AuditRunner:
    """The runs of one audit callback (:meth:`run`): the audit subset of each split (drawn through the callback's
    :class:`~lightning_xai.callbacks._audit.subset.AuditSubsets`, sized by its
    :class:`~lightning_xai.callbacks._audit.budget.AuditBudget`), the check before the first audit
    (:meth:`ensure_checked`, :meth:`probe`), the pass over this process's batches (:meth:`measure`) and the result
    of all processes' passes (:meth:`result`). The callback owns the budget, the subsets, its
    :class:`~lightning_xai.callbacks._audit.guard.AuditPrecision` and its run counter and hands them to its runner.

    Example:
        >>> runner = AuditRunner("AttentionAudit", AuditBudget(None), AuditSubsets("AttentionAudit"),
        ...                      AuditPrecision("AttentionAudit", "auto"), RunCounter())
        >>> runner.checked, runner.aggregated is None, runner.warned_undefined
        (False, True, set())
    """

    def __init__(
        self, owner: str, budget: AuditBudget, subsets: AuditSubsets, precision: AuditPrecision, runs: RunCounter
    ) -> None:
        self.owner, self.budget, self.subsets, self.precision, self.runs = owner, budget, subsets, precision, runs
        #: whether the model passed the check before the first audit (``check_model``) since the last ``setup``
        self.checked = False
        #: the default ``aggregate``'s scalars while a run aggregates (the torchmetrics every process fed), else None
        self.aggregated: Optional[Dict[str, float]] = None
        #: the values already reported as undefined (NaN for every example), warned about once each
        self.warned_undefined: Set[str] = set()

    def size(self, trainer: "pl.Trainer", split: str, num_samples: Optional[int]) -> Optional[int]:
        """Size of the audit subset of ``split``: the budget's plan, else ``num_samples``, capped by the trainer's
        ``limit_<split>_batches``."""
        loader = find_loader(trainer, split, self.owner)
        return subset_size(self.budget.planned_samples or num_samples, trainer, split, loader)

    def indices(self, trainer: "pl.Trainer", split: str, num_samples: Optional[int], seed: int) -> List[int]:
        """The fixed audit subset of ``split``: dataset indices drawn once from ``seed`` (sorted), :meth:`size`
        of them."""
        if split not in self.subsets.indices:
            dataset = find_loader(trainer, split, self.owner).dataset
            self.subsets.draw(split, dataset, self.size(trainer, split, num_samples), seed)
        return self.subsets.indices[split]

    def audit_batches(self, audit: AuditHooks, trainer: "pl.Trainer", split: str) -> List[AuditBatch]:
        """This process's shard of the audit subset (``audit_indices``, asked once) as collated CPU batches
        ``(positions, indices, batch)`` of the audit's ``batch_size`` (``None``: joined within
        ``AUDIT_TOKEN_BUDGET`` tokens, more for a model smaller than MiniLM:
        :func:`~lightning_xai.callbacks._audit.subset.join_budget`)."""
        if split not in self.subsets.batches:
            self.subsets.shard(
                trainer,
                split,
                find_loader(trainer, split, self.owner),
                audit.audit_indices(trainer, split),
                audit.batch_size,
                join_budget(getattr(trainer, "lightning_module", None), AUDIT_TOKEN_BUDGET),
                replicated=replicated(trainer),
            )
        return self.subsets.batches[split]

    def ensure_checked(
        self, audit: AuditHooks, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str
    ) -> None:
        """The callback's ``check_model`` on the ``split`` it audits, once until the next ``setup``."""
        if not self.checked:
            audit.check_model(trainer, pl_module, split)
            self.checked = True

    def probe(self, audit: AuditHooks, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """The default check before the first audit: the audit's attribution methods refused on a model they cannot
        explain sharded, the model run on two examples of the first audited batch of ``split``
        (:func:`~lightning_xai.callbacks._audit.model.probe_model`, in lockstep on a sharded model) and its
        attention override checked when the audit needs one; any failure is a :class:`MisconfigurationException`
        naming the cause."""
        refuse_unshardable(self.owner, audit.attribution_methods(), trainer, pl_module)
        model, batches = audit.explainable(pl_module), self.audit_batches(audit, trainer, split)
        if batches:
            batch = audit.audit_inputs(model, move_data_to_device(batches[0][2], pl_module.device))
            with lockstep(replicated(trainer)):  # a sharded model: process 0's data-dependent branches on all
                lookup.probe_model(self.owner, model, pl_module, batch, audit.predict, split)
            if audit.needs_attention_override:
                lookup.check_attention_override(self.owner, model)

    def run(
        self,
        audit: AuditHooks,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        stage: str,
        split: str,
        log: Log,
        *,
        default_aggregate: bool,
    ) -> AuditResult:
        """One audit of the fixed subset of ``split``: the check before the first (:meth:`ensure_checked`), this
        process's pass over its batches (:meth:`measure`) and the :meth:`result` of every process's pass."""
        with shared_failure(trainer):  # a failure on one process skips the audit on all (no gather left waiting)
            self.ensure_checked(audit, trainer, pl_module, split)
            model, batches = audit.explainable(pl_module), self.audit_batches(audit, trainer, split)
            collected = self.measure(audit, trainer, pl_module, model, batches, split)
        return self.result(audit, trainer, stage, split, collected, log, default_aggregate=default_aggregate)

    def measure(
        self,
        audit: AuditHooks,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        model: ExplainableModel,
        batches: List[AuditBatch],
        split: str,
    ) -> AuditCollector:
        """This process's pass over ``batches``: each on the module's device, made into ``audit_inputs``, predicted
        and measured (``audit_batch``) inside the audit's guard (seeded with ``seed``), lockstep and precision,
        with a progress bar. A sharded model: every process runs every batch in lockstep (each pass is a
        collective; data-dependent branches take process 0's decisions, ``adapters.sharding``); process 0 keeps
        the results."""
        collected = AuditCollector(pl_module.device, split=split, num_report_examples=audit.num_report_examples)
        keep = not replicated(trainer) or trainer.global_rank == 0
        with (
            audit_progress(trainer, len(batches), f"{self.owner} ({split})") as advance,
            audit_guard(pl_module, seed=audit.seed) as generator,
            lockstep(replicated(trainer)),
            self.precision.audit(trainer, pl_module) as context,
        ):
            for positions, indices, cpu_batch in batches:
                batch = audit.audit_inputs(model, move_data_to_device(cpu_batch, pl_module.device))
                found, extra = self._measure_batch(audit, trainer, pl_module, model, batch, indices, generator, context)
                if keep:
                    collected.add(model.token_mask(batch), batch, positions, indices, found, extra)
                advance()
        return collected

    def _measure_batch(
        self,
        audit: AuditHooks,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        model: ExplainableModel,
        batch: Dict[str, Any],
        indices: List[int],
        generator: torch.Generator,
        context: Any,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        with precision_context(trainer, pl_module.device, context):
            prediction = audit.predict(model, batch)
            with self.precision.maps(audit.name, audit.precision_sensitive):
                found, extra = audit_finite_rows(
                    lambda b, i, p: audit.audit_batch(model, b, generator, i, prediction=p or audit.predict(model, b)),
                    batch,
                    indices,
                    prediction,
                )
        return with_prediction(found, prediction, audit.expected_values()), extra

    def result(
        self,
        audit: AuditHooks,
        trainer: "pl.Trainer",
        stage: str,
        split: str,
        collected: AuditCollector,
        log: Log,
        *,
        default_aggregate: bool,
    ) -> AuditResult:
        """Every process's examples and extras gathered, aggregated (``default_aggregate``: the callback keeps the
        default ``aggregate``, which then reads :attr:`aggregated`), logged (``log(stage, scalars)``) and returned
        as the :class:`AuditResult` of the current run (``record["run"]``); a failure on one process raises on all."""
        examples = gather_examples(trainer, collected.examples)
        merged = merge_extras(trainer, collected.extras)
        if default_aggregate:  # the same class on every process: same collectives
            self.aggregated = collected.aggregator.compute(value_names(examples))
        with shared_failure(trainer):  # aggregate and log; kept (history) only when they worked on every process
            try:
                metrics = audit.aggregate(examples, merged)
            finally:
                self.aggregated = None
            warn_undefined(self.owner, split, examples, metrics, self.warned_undefined)
            result = AuditResult(
                stage=stage,
                epoch=trainer.current_epoch,
                global_step=trainer.global_step,
                split=split,
                metrics=metrics,
                examples=examples,
                extras=merged,
                run=self.runs.run,
                explained_quantity=audit.explained_quantity,
            )
            log(stage, metrics)
        return result

"""The base class of every audit callback: when to run, on which examples, without touching training.

:class:`AuditCallback` holds its triggers, its state and its model lookup itself (Lightning hooks and private
trigger methods, as Lightning's ``ModelCheckpoint``); the mechanics it calls live in the private package
``lightning_xai.callbacks._audit``, one module per concept, and a concept with state of its own is an object it owns
(the cost budget: ``AuditBudget``; the audit subsets: ``AuditSubsets``), never a mixin.
"""
from __future__ import annotations

import abc
import inspect
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.adapters.resolve import ModelResolver, ModelSpec
from lightning_xai.adapters.sharding import lockstep
from lightning_xai.attribution.registry import method_record
from lightning_xai.callbacks._audit import model as lookup
from lightning_xai.callbacks._audit.aggregation import ValueAggregator, aggregate_values, value_names
from lightning_xai.callbacks._audit.budget import (DEFAULT_EVERY_N_EPOCHS, DEFAULT_NUM_SAMPLES, MIN_AUDIT_SECONDS,
                                                   AuditBudget, Plan)
from lightning_xai.callbacks._audit.distributed import (agreed, gather_examples, merge_extras, refuse_unshardable,
                                                        replicated, shared_failure)
from lightning_xai.callbacks._audit.failures import AuditFailures, audit_finite_rows, mark_undefined, warn_undefined
from lightning_xai.callbacks._audit.generation import refuse_generator
from lightning_xai.callbacks._audit.guard import AuditPrecision, audit_guard, precision_context
from lightning_xai.callbacks._audit.options import check_audit_options, check_placement
from lightning_xai.callbacks._audit.output import (RunCounter, add_record, log_scalars, progress_bar, publish_scalars,
                                                   restored_history)
from lightning_xai.callbacks._audit.results import (AuditExample, AuditPrediction, AuditResult, BatchResult,
                                                    TokenPairs, collect_examples, example_tokens)
from lightning_xai.callbacks._audit.schedule import audit_clocks, audit_costs, clock_mark, subset_size, training_since
from lightning_xai.callbacks._audit.subset import AUDIT_TOKEN_BUDGET, AuditBatch, AuditSubsets, find_loader
from lightning_xai.lightning_compat import Callback

__all__ = ["AuditCallback", "AuditExample", "AuditPrediction", "AuditResult", "BatchResult", "TokenPairs"]


def _callbacks(trainer: "pl.Trainer") -> List[pl.Callback]:
    """``trainer.callbacks``: Lightning's CallbackConnector sets it; the Trainer class does not declare it."""
    return trainer.callbacks  # type: ignore[attr-defined]


class AuditCallback(Callback, abc.ABC):
    """Base class of the audit callbacks: scheduling, audit subset, non-invasiveness, state, logging.

    Subclasses implement :meth:`audit_batch` (per-example results of one batch of the audit subset) and may
    override :meth:`aggregate` (scalars from all per-example results); everything else is shared, including the
    prediction step (:meth:`predict`: forward pass, softmax, argmax), whose result ``audit_batch`` receives.
    A subclass may define ``summary_rows(metrics, full) -> [(label, template)]`` to choose its rows of the final
    results table (:func:`lightning_xai.reporting.final_results`); reporting reads callbacks only through such
    attributes, so a new audit callback needs no change there.

    **When it runs** (its private trigger methods): at the end of every ``every_n_epochs``-th epoch of ``fit``
    (after its validation, or at the train epoch's end when none ran), after every ``every_n_train_steps``-th
    optimizer step, and at the end of ``trainer.validate`` / ``trainer.test`` (``on_validate`` / ``on_test``);
    never in the sanity check. A failing scheduled audit is reported and skipped (``strict`` re-raises). Its cost is
    logged (``<prefix>/cost/seconds``, ``/cost/share`` of the epoch's training time). **Cost budget**
    (``budget=0.05``; ``None``: off): after the first audit of ``fit`` the callback audits every ``k``-th epoch
    (``k <= 10``), and only if that is not enough fewer examples (never below 128, the first ``N`` of the same
    draw), to spend at most ``budget`` of the training time; what the user passed (``num_samples``, the cadence)
    and audits under ``budget_min_seconds`` (5 s) are kept. The plan is logged (``<prefix>/budget/...``), printed
    and checkpointed. ``limit_<split>_batches`` (and ``fast_dev_run``) cap the audit subset of that split.

    Args:
        every_n_epochs: audit at the end of every n-th validation epoch of ``fit`` (0 or ``None``: never).
        every_n_train_steps: also audit after every n-th optimizer step (``None``: never).
        num_samples: size of the fixed audit subset (``None``: the whole split).
        dataloader: split audited during ``fit``: ``"val"`` (default), ``"train"`` or ``"test"``.
            ``trainer.validate`` audits ``"val"`` and ``trainer.test`` audits ``"test"``.
        batch_size: audit batch size (``None``: the dataloader's, with consecutive batches joined while a padded
            batch holds at most ``AUDIT_TOKEN_BUDGET`` = 8,192 tokens — e.g. ~195 SST-2 sentences per pass; long
            documents keep the dataloader's size).
        seed: seeds the audit subset and the audit's own randomness.
        on_validate / on_test: audit in ``trainer.validate`` / ``trainer.test``.
        log_prefix: prefix of the logged keys (default: the callback's ``name``).
        precision: ``"auto"`` (default): under reduced precision (``Trainer(precision="bf16-mixed")``, ``"16-*"``,
            or float16/bfloat16 weights) the precision-sensitive maps (leave-one-out, erasure, integrated
            gradients) are computed in float32, with a warning that says so (once); weights cast for this are put
            back bit for bit. ``"trainer"``: every map under the trainer's precision context (autocast for
            ``*-mixed``); ``"32"``: every map in float32.
        num_report_examples: how many audited examples keep their full maps for reports.
        strict: re-raise an exception raised inside a scheduled audit. By default (``False``) it is reported
            once per exception type (``rank_zero_warn``: the cause and what to try), the audit is skipped and
            training goes on, with every RNG, mode and gradient restored. Configuration errors found by the
            two-example probe before the first audit (:meth:`check_model`) always raise.
        model: which model of the LightningModule to explain: ``None`` finds it (the module itself, or the one
            ``transformers`` sequence classifier it holds), else an attribute path (``"model"``) or a callable
            ``pl_module -> model``. tokenizer: gives the words of reports and the special tokens (default: a
            ``tokenizer`` attribute of the module or DataModule).
        budget: share of training time the audits may take (0.05; ``None``: off), see above.

    **Several processes.** Under DDP each process audits its share of the subset and the results are gathered. A
    model sharded with FSDP2 (``fully_shard``, Lightning's ``ModelParallelStrategy``) runs a collective in every
    forward pass, so there every process audits the whole subset in lockstep and process 0 keeps the results
    (:mod:`~lightning_xai.callbacks._audit.distributed`); methods that cannot explain a sharded model are refused
    before the first audit (:meth:`attribution_methods`, ``MethodRecord.unshardable``).

    The logged scalars also land in ``trainer.callback_metrics`` (as 0-dim tensors), so ``ModelCheckpoint`` and
    ``EarlyStopping`` can monitor a faithfulness key, e.g.
    ``ModelCheckpoint(monitor="attention_audit/kendall_tau/attention_vs_gradient/mean", mode="max")``; audit at
    the checkpoint's cadence (a key keeps its last audit's value in the epochs between audits).

    Example:
        >>> from lightning_xai.callbacks import AttentionAudit
        >>> audit = AttentionAudit(every_n_epochs=2, num_samples=64)
        >>> isinstance(audit, AuditCallback), audit.log_prefix, audit.history
        (True, 'attention_audit', [])
    """

    name: str = "audit"
    #: True: the whole :meth:`audit_batch` is precision-sensitive (computed in float32 under autocast with
    #: ``precision="auto"``), as erasure is; a single map is when its method record says so (:meth:`map_precision`)
    precision_sensitive: bool = False
    #: True for audits that replace the model's attention (``attention_override``): checked before the first audit.
    needs_attention_override: bool = False
    #: the budget keeps the configured size and cadence of an audit that took less than this (seconds)
    budget_min_seconds: float = MIN_AUDIT_SECONDS
    #: why the audit cannot explain a text generator (a ``TargetSequence`` model), refused at setup; "" if it can
    refuses_generation: str = ""
    tokenizer: Any = None
    _resolver: Optional[ModelResolver] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "prediction" not in inspect.signature(cls.audit_batch).parameters:  # checked once, when the class is made
            raise TypeError(f"{cls.__name__}.audit_batch must take `prediction: Optional[AuditPrediction] = None` "
                            "(the shared prediction step's result; use `prediction or self.predict(model, batch)`).")

    def __init__(self, *, every_n_epochs: Optional[int] = DEFAULT_EVERY_N_EPOCHS,
                 every_n_train_steps: Optional[int] = None, num_samples: Optional[int] = DEFAULT_NUM_SAMPLES,
                 dataloader: str = "val", batch_size: Optional[int] = None, seed: int = 0, on_validate: bool = True,
                 on_test: bool = True, log_prefix: Optional[str] = None, precision: str = "auto",
                 num_report_examples: int = 16, strict: bool = False, model: ModelSpec = None, tokenizer: Any = None,
                 budget: Optional[float] = 0.05) -> None:
        super().__init__()
        cls = type(self).__name__
        self._resolver = lookup.model_resolver(model, tokenizer, cls)
        self.tokenizer = tokenizer
        check_audit_options(cls, every_n_epochs=every_n_epochs, every_n_train_steps=every_n_train_steps,
                            on_validate=on_validate, on_test=on_test, num_samples=num_samples, dataloader=dataloader,
                            batch_size=batch_size, seed=seed, precision=precision,
                            num_report_examples=num_report_examples, strict=strict, budget=budget)
        self._budget = AuditBudget(budget, num_samples=num_samples, every_n_epochs=every_n_epochs,
                                   every_n_train_steps=every_n_train_steps)  # its cost clock, plan and cadence
        self.every_n_epochs = int(every_n_epochs or 0)
        self.every_n_train_steps = every_n_train_steps
        self.num_samples = None if num_samples is None else int(num_samples)
        self.dataloader, self.batch_size, self.seed = dataloader, batch_size, seed
        self.on_validate, self.on_test = on_validate, on_test
        self.log_prefix = log_prefix or self.name
        self.precision, self._precision = precision, AuditPrecision(cls, precision)
        self.num_report_examples = num_report_examples
        self.strict, self._failures = strict, AuditFailures(cls, strict)
        self._runs = RunCounter()
        self.history: List[Dict[str, Any]] = []
        self.latest: Optional[AuditResult] = None
        self.version = 0  # bumps on every audit; reporters watch it
        self._subsets = AuditSubsets(cls)  # the drawn indices (checkpointed) and this process's batches
        self._warned_no_logger, self._checked = False, False
        self._warned_undefined: Set[str] = set()
        self._last_step_audited: Optional[int] = None
        self._epoch_audited: Optional[int] = None
        self._aggregated: Optional[Dict[str, float]] = None

    # --- identity and state ---------------------------------------------------------------------------
    @property
    def budget(self) -> Optional[float]:
        """The share of training time the audits may take (``None``: no budget)."""
        return self._budget.share

    @budget.setter
    def budget(self, share: Optional[float]) -> None:
        self._budget.share = None if share is None else float(share)

    @property
    def plan(self) -> Optional[Plan]:
        """The cost budget's plan, chosen after the first audit of ``fit`` (``None``: none yet, or no budget)."""
        return self._budget.plan

    def _state_config(self) -> Dict[str, Any]:
        """Settings that tell two instances of a callback class apart (extended by subclasses); a log prefix and a
        precision join them only when not the defaults, so existing checkpoints keep their keys."""
        config = {"every_n_epochs": self.every_n_epochs, "every_n_train_steps": self.every_n_train_steps,
                  "num_samples": self.num_samples, "dataloader": self.dataloader, "seed": self.seed}
        optional = {"log_prefix": (self.log_prefix, self.name), "precision": (self.precision, "auto")}
        return {**config, **{k: value for k, (value, default) in optional.items() if value != default}}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(**self._state_config())

    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"history": [dict(r, metrics=dict(r["metrics"])) for r in self.history],
                "subsets": self._subsets.state_dict(), "budget": self._budget.state_dict()}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = restored_history(self.history, state_dict.get("history", []))
        self._runs.restored(self.history)
        self._subsets.load_state_dict(state_dict.get("subsets", {}))
        self._budget.load_state_dict(state_dict.get("budget"))

    # --- the Lightning hooks: setup, and the triggers of scheduled audits --------------------------------------
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if trainer is not None:  # None: set up by hand (notebooks, tests)
            check_placement(self, [c for c in _callbacks(trainer) if isinstance(c, AuditCallback)], trainer, stage)
            if self._runs.enter(trainer, type(self).__name__):  # a new Trainer counts its epochs and steps from 0
                self._epoch_audited = self._last_step_audited = None
        refuse_generator(type(self).__name__, self.explainable(pl_module), self.refuses_generation)
        self._checked = False
        self._subsets.batches = {}

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.every_n_epochs or self.every_n_train_steps:  # a probe failing on one process raises on all
            agreed(trainer, self._ensure_checked, trainer, pl_module, self.dataloader)

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._budget.mark = clock_mark(_callbacks(trainer))

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._budget.cost.epoch_started()

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        n = self.every_n_train_steps
        step = trainer.global_step
        if n and step > 0 and step % n == 0 and step != self._last_step_audited:
            self._last_step_audited = step
            self._scheduled_audit(trainer, pl_module, "fit", self.dataloader)

    @override
    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.sanity_checking:
            return
        fn = trainer.state.fn
        if fn == "fit":
            self._epoch_audit(trainer, pl_module)
        elif fn == "validate" and self.on_validate:
            self._scheduled_audit(trainer, pl_module, "validate", "val")

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # Runs after the epoch's validation: audits here only when no validation ran this epoch.
        self._epoch_audit(trainer, pl_module)
        self._epoch_cost(trainer)

    @override
    def on_test_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.on_test:
            self._scheduled_audit(trainer, pl_module, "test", "test")

    def _epoch_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        epoch = trainer.current_epoch
        if self._budget.epoch_due(epoch, self.every_n_epochs) and self._epoch_audited != epoch:
            self._epoch_audited = epoch
            self._scheduled_audit(trainer, pl_module, "fit", self.dataloader)

    def _scheduled_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str
                         ) -> Optional[AuditResult]:
        """:meth:`run_audit`, isolated and clocked: the result, or ``None`` when the audit failed (and was
        reported; with ``strict`` the exception propagates). The first audit of ``fit`` sets the budget's plan."""
        start = time.perf_counter()
        training = (training_since(self._budget.mark, start, audit_clocks(_callbacks(trainer))) if stage == "fit"
                    else 0.0)
        try:  # every step agrees across processes (distributed.shared_failure): all report, or all raise
            result = self.run_audit(trainer, pl_module, stage, split)
            seconds = time.perf_counter() - start
            self._budget.cost.audited(seconds)
            agreed(trainer, self._log, trainer, stage, {"cost/seconds": seconds})
            if stage == "fit":
                self._apply_budget(trainer, split, seconds, training)
        except Exception as err:  # noqa: BLE001 - any failure of an audit is reported, training goes on
            self._failures.report(err, stage, split, trainer.current_epoch, trainer.global_step)
            return None
        if stage == "fit":
            self._budget.mark = clock_mark(_callbacks(trainer))
        if stage != "fit" and (line := self._budget.cost.first_announcement(type(self).__name__)):
            rank_zero_info(line)
        return result

    def _epoch_cost(self, trainer: "pl.Trainer") -> None:
        spent = self._budget.cost.epoch_ended(audit_costs(_callbacks(trainer)))
        if spent is None:
            return
        audits, training = spent
        metrics: Dict[str, float] = {"cost/share": audits / training if training > 0 else float("nan")}
        try:  # a logger failing on one process: reported (or raised) on every process alike
            agreed(trainer, self._log, trainer, "fit", metrics)
        except Exception as err:  # noqa: BLE001 - as a failed audit
            self._failures.report(err, "fit", self.dataloader, trainer.current_epoch, trainer.global_step)
            return
        if line := self._budget.cost.first_announcement(type(self).__name__, audits, training):
            rank_zero_info(line)

    def _apply_budget(self, trainer: "pl.Trainer", split: str, seconds: float, training: float) -> None:
        """After the first audit of ``fit``: size the subset and cadence to the budget, log the plan."""
        audited = self._subsets.audited(split)
        # Trainer.fast_dev_run is set by Lightning's debugging setup; the Trainer class does not declare it
        if not self._budget.wanted(audited, training) or trainer.fast_dev_run:  # type: ignore[attr-defined]
            return
        with shared_failure(trainer):  # a failure on one process: every process raises, none waits in the broadcast
            limited = self._audit_size(trainer, split, self._loader(trainer, split)) != self.num_samples
            chosen = self._budget.choose(seconds, training, audited, limited=limited,
                                         min_seconds=self.budget_min_seconds)
        chosen = trainer.strategy.broadcast(chosen, src=0)  # every process audits the same subset, same cadence
        if self._budget.adopt(chosen, audited, trainer.current_epoch):  # the first N of the same seeded draw
            self._subsets.forget(split)
        measured = seconds / training
        with shared_failure(trainer):  # logging the plan failed on one process: an audit failure on all
            self._log(trainer, "fit", self._budget.scalars(measured, self.every_n_epochs))
            rank_zero_info(self._budget.announcement(type(self).__name__, measured, self.every_n_epochs,
                                                     self.every_n_train_steps))

    # --- the model: which one, its words, whether the audit can read it -----------------------------------------
    def explainable(self, pl_module: Any) -> ExplainableModel:
        """The module seen through the protocol (the module itself, the one ``transformers`` classifier it holds, or
        the callback's ``model=``), or a :class:`MisconfigurationException` saying how to fix it."""
        if self._resolver is None:
            self._resolver = ModelResolver(owner=type(self).__name__)
        return lookup.explainable_model(self._resolver, pl_module, type(self).__name__)

    def example_tokens(self, trainer: Any, pl_module: Any, example: AuditExample) -> List[str]:
        """The words of an audited example (see :func:`~lightning_xai.callbacks._audit.results.example_tokens`)."""
        tokenizer = lookup.report_tokenizer(self._resolver, self.tokenizer, trainer, pl_module)
        return example_tokens(trainer, pl_module, example, tokenizer=tokenizer)

    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """Run the model on two audit examples and check what the audit needs (called before the first audit).

        The default checks that the protocol's forward pass runs and returns ``[B, C]`` logits and a ``[B, T]``
        attention, then runs the model's own ``probe(batch)`` when it has one (:class:`~lightning_xai.adapters.
        HookAdapter`: the attention module returns weights, and they feed the logits). Any failure is a
        :class:`MisconfigurationException` that names the cause, raised before training goes on.
        """
        refuse_unshardable(type(self).__name__, self.attribution_methods(), trainer, pl_module)
        model = self.explainable(pl_module)
        batches = self._audit_batches(trainer, split)
        if batches:
            batch = self.audit_inputs(model, move_data_to_device(batches[0][2], pl_module.device))
            with lockstep(replicated(trainer)):  # a sharded model: process 0's data-dependent branches on all
                lookup.probe_model(type(self).__name__, model, pl_module, batch, self.predict, split)
            if self.needs_attention_override:
                lookup.check_attention_override(type(self).__name__, model)

    def attribution_methods(self) -> List[str]:
        """The registered attribution methods the audit runs (default none): a model sharded with FSDP2 is refused
        before the first audit when one of them cannot explain it (``MethodRecord.unshardable``)."""
        return []

    def _ensure_checked(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        if not self._checked:
            self.check_model(trainer, pl_module, split)
            self._checked = True

    # --- the audit subset ----------------------------------------------------------------------------------
    def _loader(self, trainer: "pl.Trainer", split: str) -> Any:
        return find_loader(trainer, split, type(self).__name__)

    def _audit_size(self, trainer: "pl.Trainer", split: str, loader: Any) -> Optional[int]:
        """Size of the audit subset of ``split``: the budget's plan, else ``num_samples``, capped by the trainer's
        ``limit_<split>_batches``."""
        return subset_size(self._budget.planned_samples or self.num_samples, trainer, split, loader)

    def audit_indices(self, trainer: "pl.Trainer", split: str) -> List[int]:
        """The fixed audit subset of ``split``: ``num_samples`` dataset indices drawn once from ``seed`` (sorted)."""
        if split not in self._subsets.indices:
            dataset = self._loader(trainer, split).dataset
            self._subsets.draw(split, dataset, self._audit_size(trainer, split, self._loader(trainer, split)), self.seed)
        return self._subsets.indices[split]

    def _audit_batches(self, trainer: "pl.Trainer", split: str) -> List[AuditBatch]:
        """This process's shard of the audit subset as collated CPU batches ``(positions, indices, batch)``."""
        if split not in self._subsets.batches:
            loader = self._loader(trainer, split)
            self._subsets.shard(trainer, split, loader, self.audit_indices(trainer, split), self.batch_size,
                                AUDIT_TOKEN_BUDGET, replicated=replicated(trainer))
        return self._subsets.batches[split]

    # --- running ------------------------------------------------------------------------------------------
    def run_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str) -> AuditResult:
        """Audit the fixed subset of ``split`` now, log the scalars and append them to :attr:`history`."""
        with shared_failure(trainer):  # a failure on one process skips the audit on all (no gather left waiting)
            self._ensure_checked(trainer, pl_module, split)
            model = self.explainable(pl_module)
            examples: List[AuditExample] = []
            extras: List[Dict[str, Any]] = []
            batches = self._audit_batches(trainer, split)
            bar = progress_bar(trainer, len(batches), f"{type(self).__name__} ({split})")
            aggregator = ValueAggregator(pl_module.device)
            # a sharded model: every process ran every batch, in lockstep (its passes are collectives); process 0
            # keeps the results, the others add nothing to the gathers (_audit.distributed)
            keep = not replicated(trainer) or trainer.global_rank == 0
            try:  # lockstep: the passes' data-dependent branches take process 0's decisions (adapters.sharding)
                with audit_guard(pl_module, seed=self.seed) as generator, lockstep(replicated(trainer)), \
                        self._precision.audit(trainer, pl_module) as context:
                    for positions, indices, cpu_batch in batches:
                        batch = self.audit_inputs(model, move_data_to_device(cpu_batch, pl_module.device))
                        found, extra = self._measure(trainer, pl_module, model, batch, indices, generator, context)
                        if keep:
                            aggregator.update(found.values)
                            examples.extend(collect_examples(model.token_mask(batch), batch, positions, indices,
                                                             split, found, self.num_report_examples))
                            extras.append(extra)
                        if bar is not None:
                            bar.update(1)
            finally:
                if bar is not None:
                    bar.close()
        examples = gather_examples(trainer, examples)
        merged = merge_extras(trainer, extras)
        if type(self).aggregate is AuditCallback.aggregate:  # the same class on every process: same collectives
            self._aggregated = aggregator.compute(value_names(examples))
        with shared_failure(trainer):  # aggregate and log; kept (history) only when they worked on every process
            try:
                metrics = self.aggregate(examples, merged)
            finally:
                self._aggregated = None
            warn_undefined(type(self).__name__, split, examples, metrics, self._warned_undefined)
            result = AuditResult(stage=stage, epoch=trainer.current_epoch, global_step=trainer.global_step,
                                 split=split, metrics=metrics, examples=examples, extras=merged, run=self._runs.run)
            self._log(trainer, stage, metrics)
        self.history = add_record(self.history, result.record())
        self.latest = result
        self.version += 1
        return result

    def _measure(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", model: ExplainableModel,
                 batch: Dict[str, Any], indices: List[int], generator: torch.Generator, context: Any
                 ) -> Tuple[BatchResult, Dict[str, Any]]:
        with precision_context(trainer, pl_module.device, context):
            prediction = self.predict(model, batch)
            with self._precision.maps(self.name, self.precision_sensitive):
                found, extra = audit_finite_rows(lambda b, i, p: self.audit_batch(
                    model, b, generator, i, prediction=p or self.predict(model, b)), batch, indices, prediction)
        found = replace(found, prediction=prediction.prediction if found.prediction is None else found.prediction,
                        probability=prediction.probability if found.probability is None else found.probability)
        return mark_undefined(found, prediction.finite, self.expected_values()), extra

    def _log(self, trainer: "pl.Trainer", stage: str, metrics: Dict[str, float]) -> None:
        prefix = self.log_prefix if stage == "fit" else f"{stage}/{self.log_prefix}"
        publish_scalars(trainer, prefix, metrics)
        if not log_scalars(trainer, prefix, metrics) and not self._warned_no_logger:
            rank_zero_warn(f"{type(self).__name__}: the trainer has no logger; audit results are kept in "
                           "callback.history (and written by lightning_xai.reporting.AuditReport if present).")
            self._warned_no_logger = True

    def map_precision(self, method: str) -> Any:
        """Context for computing the map of attribution ``method`` in :meth:`audit_batch`: float32 when its
        :class:`~lightning_xai.attribution.MethodRecord` says ``precision_sensitive`` and the audit runs under
        autocast with ``precision="auto"``, else nothing."""
        return self._precision.maps(method, method_record(method).precision_sensitive)

    def predict(self, model: ExplainableModel, batch: Dict[str, Any]) -> AuditPrediction:
        """The prediction step every audit shares: the protocol's forward pass (no gradients), softmax, argmax."""
        with torch.no_grad():
            return AuditPrediction.from_output(model.forward_from_embeddings(model.embed(batch), batch))

    def audit_inputs(self, model: ExplainableModel, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The batch the audit explains, made from an audited batch (on the module's device, in the audit's guard):
        the batch itself by default; e.g. a generator's batch with the model's greedy output as its target
        (``AttentionAudit(decoding="free")``)."""
        return batch

    def expected_values(self) -> List[str]:
        """Per-example value names the audit always reports (NaN for undefined examples, so a metric no example
        defines is still logged, as NaN); default none beyond those its batches return."""
        return []

    # --- what subclasses implement ------------------------------------------------------------------------
    def example_generators(self, indices: Sequence[int]) -> List[torch.Generator]:
        """One CPU generator per example, seeded from ``seed`` and the example's dataset index: randomness that
        does not depend on how the audit subset is batched or sharded across processes."""
        return [torch.Generator().manual_seed((self.seed * 1_000_003 + int(i)) % (2 ** 63)) for i in indices]

    @abc.abstractmethod
    def audit_batch(self, model: ExplainableModel, batch: Dict[str, Any], generator: torch.Generator,
                    indices: List[int], prediction: Optional[AuditPrediction] = None
                    ) -> Tuple[BatchResult, Dict[str, Any]]:
        """Measure one batch (``indices``: the dataset indices of its rows; ``generator``: the audit's own RNG;
        ``prediction``: the shared prediction step's result — ``None`` when called directly, then use
        ``prediction or self.predict(model, batch)``).

        Returns:
            ``(found, extra)``: ``found`` is a :class:`BatchResult` with the ``maps`` ``{name: [B, T]}`` and
            per-example ``values`` ``{name: [B]}`` (``prediction``/``probability`` ``[B]`` come from the prediction
            step unless given here); ``extra`` is merged over batches (and processes) and passed to
            :meth:`aggregate`.
        """

    def aggregate(self, examples: List[AuditExample], extras: Dict[str, Any]) -> Dict[str, float]:
        """Scalars to log from every audited example (the same on every process).

        The default logs ``<value>/mean``, ``/std`` and, for values with a ``<value>/p_value``,
        ``/significant_fraction`` (p ≤ 0.05) of every per-example value, NaN instances left out. Inside
        :meth:`run_audit` they come from the :class:`~lightning_xai.metrics.ValueMean` torchmetrics each process
        fed with its shard (DDP sync by torchmetrics); called directly, the same code runs on ``examples``.
        """
        if self._aggregated is not None:
            return dict(self._aggregated)
        return aggregate_values(examples)

    def histogram_keys(self, examples: List[AuditExample]) -> List[str]:
        """Per-example values whose histogram the reports draw (default: all but p-values)."""
        keys: List[str] = []
        for example in examples:
            keys.extend(k for k in example.values if k not in keys and not k.endswith("/p_value"))
        return keys

"""The base class of every audit callback: when to run, on which examples, without touching training.

:class:`AuditCallback` holds its Lightning hooks, state, model lookup and the hooks its subclasses override (as
Lightning's ``ModelCheckpoint``); the mechanics live in ``lightning_xai.callbacks._audit``, one module per concept,
and a concept with state of its own is an object it owns (``AuditBudget``, ``AuditSchedule``, ``AuditSubsets``, the
``AuditRunner`` that runs an audit from its subset to its result, ...), never a mixin.
"""

from __future__ import annotations

import abc
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.adapters.resolve import ModelResolver, ModelSpec
from lightning_xai.attribution.registry import method_record
from lightning_xai.callbacks._audit import model as lookup
from lightning_xai.callbacks._audit.aggregation import aggregate_values, histogram_values
from lightning_xai.callbacks._audit.budget import (
    DEFAULT_EVERY_N_EPOCHS,
    DEFAULT_NUM_SAMPLES,
    MIN_AUDIT_SECONDS,
    AuditBudget,
    Plan,
)
from lightning_xai.callbacks._audit.distributed import agreed
from lightning_xai.callbacks._audit.failures import AuditFailures
from lightning_xai.callbacks._audit.generation import refuse_generator
from lightning_xai.callbacks._audit.guard import AuditPrecision
from lightning_xai.callbacks._audit.options import check_audit_batch, check_audit_options, check_placement
from lightning_xai.callbacks._audit.output import RunCounter, ScalarLog, add_record, restored_history
from lightning_xai.callbacks._audit.results import (
    AuditExample,
    AuditPrediction,
    AuditResult,
    BatchResult,
    TokenPairs,
    example_tokens,
)
from lightning_xai.callbacks._audit.runner import AuditRunner, shared_prediction
from lightning_xai.callbacks._audit.schedule import AuditSchedule, clock_mark, trainer_callbacks
from lightning_xai.callbacks._audit.state import audit_state, load_audit_state, state_settings
from lightning_xai.callbacks._audit.subset import AuditBatch, AuditSubsets
from lightning_xai.lightning_compat import Callback

__all__ = ["AuditCallback", "AuditExample", "AuditPrediction", "AuditResult", "BatchResult", "TokenPairs"]


class AuditCallback(Callback, abc.ABC):
    """Base class of the audit callbacks: scheduling, audit subset, non-invasiveness, state, logging.

    Subclasses implement :meth:`audit_batch` (per-example results of one batch of the audit subset) and may
    override :meth:`aggregate`; everything else is shared, including the prediction step (:meth:`predict`), whose
    result ``audit_batch`` receives, and ``summary_rows(metrics, full)`` chooses a subclass's rows of the final
    results table (:func:`lightning_xai.reporting.final_results`, which reads callbacks only through such attributes).

    **When it runs** (its private trigger methods): at the end of every ``every_n_epochs``-th epoch of ``fit``
    (after its validation, or at the train epoch's end when none ran), after every ``every_n_train_steps``-th
    optimizer step, and at the end of ``trainer.validate`` / ``trainer.test`` (``on_validate`` / ``on_test``);
    never in the sanity check. A failing scheduled audit is reported and skipped (``strict`` re-raises). Its cost is
    logged (``<prefix>/cost/seconds``, ``/cost/share`` of the epoch's training time). **Cost budget** (``budget=0.05``;
    ``None``: off): fewer audits, then fewer examples, after the first (see
    :class:`~lightning_xai.callbacks._audit.budget.AuditBudget`). ``limit_<split>_batches`` (and ``fast_dev_run``)
    cap the audit subset of that split.

    Args:
        every_n_epochs: audit at the end of every n-th validation epoch of ``fit`` (0 or ``None``: never).
        every_n_train_steps: also audit after every n-th optimizer step (``None``: never).
        num_samples: size of the fixed audit subset (``None``: the whole split).
        dataloader: split audited during ``fit``: ``"val"`` (default), ``"train"`` or ``"test"``.
            ``trainer.validate`` audits ``"val"`` and ``trainer.test`` audits ``"test"``.
        batch_size: audit batch size (``None``: the dataloader's, consecutive batches joined while a padded batch
            holds at most ``AUDIT_TOKEN_BUDGET`` = 8,192 tokens, ~195 SST-2 sentences, up to 4× that for a model
            smaller than all-MiniLM-L6-v2 (:func:`~lightning_xai.callbacks._audit.subset.join_budget`); long
            documents stay apart).
        seed: seeds the audit subset and the audit's own randomness.
        on_validate / on_test: audit in ``trainer.validate`` / ``trainer.test``.
        log_prefix: prefix of the logged keys (default: the callback's ``name``).
        precision: ``"auto"`` (default): under reduced precision the precision-sensitive maps (leave-one-out,
            erasure, integrated gradients) in float32, saying so once; ``"trainer"``: every map under the trainer's
            precision; ``"32"``: every map in float32 (:class:`~lightning_xai.callbacks._audit.guard.AuditPrecision`).
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

    **Several processes**: a DDP process audits its share of the subset; under FSDP2 (``ModelParallelStrategy``) all
    audit it all in lockstep, process 0 keeping the results (:mod:`~lightning_xai.callbacks._audit.distributed`).

    The logged scalars also land in ``trainer.callback_metrics`` (0-dim tensors), so ``ModelCheckpoint`` and
    ``EarlyStopping`` can monitor e.g. ``"attention_audit/kendall_tau/attention_vs_gradient/mean"``; audit at their
    cadence (a key keeps its last audit's value in the epochs between audits).

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
    #: what the audit's maps and scores explain, in words (set at setup by audits that explain a score; recorded)
    explained_quantity: Optional[str] = None
    tokenizer: Any = None
    _resolver: Optional[ModelResolver] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_audit_batch(cls)  # checked once, when the class is made

    def __init__(
        self,
        *,
        every_n_epochs: Optional[int] = DEFAULT_EVERY_N_EPOCHS,
        every_n_train_steps: Optional[int] = None,
        num_samples: Optional[int] = DEFAULT_NUM_SAMPLES,
        dataloader: str = "val",
        batch_size: Optional[int] = None,
        seed: int = 0,
        on_validate: bool = True,
        on_test: bool = True,
        log_prefix: Optional[str] = None,
        precision: str = "auto",
        num_report_examples: int = 16,
        strict: bool = False,
        model: ModelSpec = None,
        tokenizer: Any = None,
        budget: Optional[float] = 0.05,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        self._resolver, self.tokenizer = lookup.model_resolver(model, tokenizer, cls), tokenizer
        check_audit_options(
            cls,
            every_n_epochs=every_n_epochs,
            every_n_train_steps=every_n_train_steps,
            on_validate=on_validate,
            on_test=on_test,
            num_samples=num_samples,
            dataloader=dataloader,
            batch_size=batch_size,
            seed=seed,
            precision=precision,
            num_report_examples=num_report_examples,
            strict=strict,
            budget=budget,
        )
        self._budget = AuditBudget(
            budget, num_samples=num_samples, every_n_epochs=every_n_epochs, every_n_train_steps=every_n_train_steps
        )  # its cost clock, plan and cadence
        self.every_n_epochs, self.every_n_train_steps = int(every_n_epochs or 0), every_n_train_steps
        self.num_samples = None if num_samples is None else int(num_samples)
        self.dataloader, self.batch_size, self.seed = dataloader, batch_size, seed
        self.on_validate, self.on_test = on_validate, on_test
        self.log_prefix, self.num_report_examples = log_prefix or self.name, num_report_examples
        self.precision, self._precision = precision, AuditPrecision(cls, precision)
        self.strict, self._failures = strict, AuditFailures(cls, strict)
        self._runs = RunCounter()
        self.history: List[Dict[str, Any]] = []
        self.latest: Optional[AuditResult] = None
        self.version = 0  # bumps on every audit; reporters watch it
        self._subsets = AuditSubsets(cls)  # the drawn indices (checkpointed) and this process's batches
        self._schedule = AuditSchedule(cls, self._budget, self._subsets, self._failures)  # what ran; how one runs
        self._scalars = ScalarLog(cls)  # callback_metrics and the loggers (one warning without a logger)
        self._runner = AuditRunner(cls, self._budget, self._subsets, self._precision, self._runs)  # how audits run

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
        """Settings that tell two instances of a callback class apart (extended by subclasses; see
        :func:`~lightning_xai.callbacks._audit.state.state_settings`)."""
        return state_settings(self)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(**self._state_config())

    @override
    def state_dict(self) -> Dict[str, Any]:
        return audit_state(self.history, self._subsets, self._budget)

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = restored_history(self.history, state_dict.get("history", []))
        load_audit_state(state_dict, self.history, self._runs, self._subsets, self._budget)

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if trainer is not None:  # None: set up by hand (notebooks, tests)
            check_placement(
                self, [c for c in trainer_callbacks(trainer) if isinstance(c, AuditCallback)], trainer, stage
            )
            if self._runs.enter(trainer, type(self).__name__):  # a new Trainer counts its epochs and steps from 0
                self._schedule.reset()
        refuse_generator(type(self).__name__, self.explainable(pl_module), self.refuses_generation)
        self._runner.checked = False
        self._subsets.batches = {}

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.every_n_epochs or self.every_n_train_steps:  # a probe failing on one process raises on all
            agreed(trainer, self._ensure_checked, trainer, pl_module, self.dataloader)

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._budget.mark = clock_mark(trainer_callbacks(trainer))

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._budget.cost.epoch_started()

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._schedule.step_due(trainer.global_step, self.every_n_train_steps):
            self._scheduled_audit(trainer, pl_module, "fit", self.dataloader)

    @override
    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        fn = None if trainer.sanity_checking else trainer.state.fn
        if fn == "fit":
            self._epoch_audit(trainer, pl_module)
        elif fn == "validate" and self.on_validate:
            self._scheduled_audit(trainer, pl_module, "validate", "val")

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # Runs after the epoch's validation: audits here only when no validation ran this epoch.
        self._epoch_audit(trainer, pl_module)
        self._schedule.epoch_ended(trainer, partial(self._log, trainer), self.dataloader)

    @override
    def on_test_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.on_test:
            self._scheduled_audit(trainer, pl_module, "test", "test")

    def _epoch_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._schedule.epoch_due(trainer.current_epoch, self.every_n_epochs):
            self._scheduled_audit(trainer, pl_module, "fit", self.dataloader)

    def _scheduled_audit(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str
    ) -> Optional[AuditResult]:
        """:meth:`run_audit`, isolated and clocked: the result, or ``None`` when the audit failed (and was
        reported; with ``strict`` the exception propagates). The first audit of ``fit`` sets the budget's plan."""
        return self._schedule.run(
            trainer,
            stage,
            split,
            partial(self.run_audit, trainer, pl_module, stage, split),
            partial(self._log, trainer),
            lambda: self._runner.size(trainer, split, self.num_samples) != self.num_samples,
            min_seconds=self.budget_min_seconds,
            cadence=(self.every_n_epochs, self.every_n_train_steps),
        )

    def explainable(self, pl_module: Any) -> ExplainableModel:
        """The module seen through the protocol (the module itself, the one ``transformers`` classifier it holds, or
        the callback's ``model=``), or a :class:`MisconfigurationException` saying how to fix it."""
        if self._resolver is None:
            self._resolver = ModelResolver(owner=type(self).__name__)
        return lookup.explainable_model(self._resolver, pl_module, type(self).__name__)

    def example_tokens(self, trainer: Any, pl_module: Any, example: AuditExample, target: bool = False) -> List[str]:
        """The words of an audited example, or (``target``) of a generator example's target tokens (see
        :func:`~lightning_xai.callbacks._audit.results.example_tokens`)."""
        tokenizer = lookup.report_tokenizer(self._resolver, self.tokenizer, trainer, pl_module)
        return example_tokens(trainer, pl_module, example, tokenizer=tokenizer, target=target)

    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """Run the model on two audit examples and check what the audit needs (called before the first audit): the
        default runs :func:`~lightning_xai.callbacks._audit.model.probe_model` (the prediction step, the model's own
        ``probe(batch)``, ``[B, C]`` logits and a ``[B, T]`` attention); any failure is a
        :class:`MisconfigurationException` that names the cause, raised before training goes on."""
        self._runner.probe(self, trainer, pl_module, split)

    def attribution_methods(self) -> List[str]:
        """The registered attribution methods the audit runs (default none): a model sharded with FSDP2 is refused
        before the first audit when one of them cannot explain it (``MethodRecord.unshardable``)."""
        return []

    def _ensure_checked(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        self._runner.ensure_checked(self, trainer, pl_module, split)

    def audit_indices(self, trainer: "pl.Trainer", split: str) -> List[int]:
        """The fixed audit subset of ``split``: ``num_samples`` dataset indices drawn once from ``seed`` (sorted)."""
        return self._runner.indices(trainer, split, self.num_samples, self.seed)

    def _audit_batches(self, trainer: "pl.Trainer", split: str) -> List[AuditBatch]:
        """This process's shard of the audit subset as collated CPU batches ``(positions, indices, batch)``."""
        return self._runner.audit_batches(self, trainer, split)

    def run_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str) -> AuditResult:
        """Audit the fixed subset of ``split`` now, log the scalars and append them to :attr:`history` (the run's
        steps: :class:`~lightning_xai.callbacks._audit.runner.AuditRunner`)."""
        default = type(self).aggregate is AuditCallback.aggregate  # which aggregate: the same on every process
        result = self._runner.run(
            self, trainer, pl_module, stage, split, partial(self._log, trainer), default_aggregate=default
        )
        self.history, self.latest = add_record(self.history, result.record()), result
        self.version += 1
        return result

    def _log(self, trainer: "pl.Trainer", stage: str, metrics: Dict[str, float]) -> None:
        self._scalars(trainer, self.log_prefix if stage == "fit" else f"{stage}/{self.log_prefix}", metrics)

    def map_precision(self, method: str) -> Any:
        """Context for computing the map of attribution ``method`` in :meth:`audit_batch`: float32 when its record
        says ``precision_sensitive`` and the audit runs under autocast with ``precision="auto"``, else nothing."""
        return self._precision.maps(method, method_record(method).precision_sensitive)

    def predict(self, model: ExplainableModel, batch: Dict[str, Any]) -> AuditPrediction:
        """The prediction step every audit shares: the protocol's forward pass (no gradients), read through the
        model's head (:meth:`AuditPrediction.from_output`: softmax and argmax for a classifier)."""
        return shared_prediction(model, batch)

    def audit_inputs(self, model: ExplainableModel, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The batch the audit explains, made from an audited batch (on the module's device, in the audit's guard):
        itself by default (a generator's with its greedy output as target: ``AttentionAudit(decoding="free")``)."""
        return batch

    def expected_values(self) -> List[str]:
        """Per-example value names the audit always reports (NaN where undefined: no metric silently disappears)."""
        return []

    def example_generators(self, indices: Sequence[int]) -> List[torch.Generator]:
        """One CPU generator per example, seeded from ``seed`` and the example's dataset index: randomness that
        does not depend on how the audit subset is batched or sharded across processes."""
        return [torch.Generator().manual_seed((self.seed * 1_000_003 + int(i)) % (2**63)) for i in indices]

    @abc.abstractmethod
    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: List[int],
        prediction: Optional[AuditPrediction] = None,
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
        if self._runner.aggregated is not None:
            return dict(self._runner.aggregated)
        return aggregate_values(examples)

    def histogram_keys(self, examples: List[AuditExample]) -> List[str]:
        """Per-example values whose histogram the reports draw (default: all but p-values)."""
        return histogram_values(examples)

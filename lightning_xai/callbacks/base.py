"""The machinery every audit callback shares: when to run, on which examples, without touching training.

An audit callback runs a measurement on a *fixed audit subset* — the same ``num_samples`` examples of one
split every time, drawn once from ``seed`` — at a cadence (every ``n`` epochs at validation end and/or every
``n`` optimizer steps), and in ``trainer.validate``/``trainer.test``. It is *non-invasive*: it saves and
restores the global RNGs (python, numpy, torch, CUDA), every module's train/eval mode, every parameter's
``requires_grad`` and ``.grad``, and works under Lightning's ``no_grad`` validation and the ``inference_mode`` of
``validate``/``test``. Under DDP each process audits its shard of the subset; per-example results are gathered
so every process holds (and logs) the numbers one process would compute. Results go to every logger, to
``callback.history`` (checkpointed, so a resumed run continues it), and to ``callback.latest`` (per-example detail
for :mod:`lightning_xai.reporting`). Each job lives in its own module: :mod:`~lightning_xai.callbacks.schedule` (when),
:mod:`~lightning_xai.callbacks.subset` (which examples, batched within a token budget),
:mod:`~lightning_xai.callbacks.guard` (non-invasiveness, precision), :mod:`~lightning_xai.callbacks.results`
(the typed per-example result), :mod:`~lightning_xai.callbacks.distributed` (DDP gather),
:mod:`~lightning_xai.callbacks.aggregation` (the logged scalars) and :mod:`~lightning_xai.callbacks.output`
(history, loggers, progress bar). This module composes them into :class:`AuditCallback` and re-exports them.
"""
from __future__ import annotations

import abc
import inspect
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.adapters.resolve import ModelSpec
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.attribution.registry import method_record
from lightning_xai.callbacks.aggregation import ValueAggregator, aggregate_values, summarize_values, value_names
from lightning_xai.callbacks.budget import DEFAULT_EVERY_N_EPOCHS, DEFAULT_NUM_SAMPLES
from lightning_xai.callbacks.cost import AuditCost
from lightning_xai.callbacks.distributed import gather_examples, merge_extras, shared_failure
from lightning_xai.callbacks.guard import AuditPrecision, audit_guard, precision_context
from lightning_xai.callbacks.isolation import AuditFailures
from lightning_xai.callbacks.options import check_audit_options, check_placement
from lightning_xai.callbacks.output import (RunCounter, add_record, log_scalars, progress_bar, publish_scalars,
                                            restored_history)
from lightning_xai.callbacks.resolve import ModelLookup
from lightning_xai.callbacks.results import AuditExample, AuditPrediction, AuditResult, collect_examples
from lightning_xai.callbacks.schedule import AuditSchedule, check_cadence
from lightning_xai.callbacks.subset import (AUDIT_TOKEN_BUDGET, AuditBatch, build_batches, draw_subset,
                                            find_loader)
from lightning_xai.callbacks.undefined import audit_finite_rows, mark_undefined, warn_undefined

__all__ = ["AUDIT_TOKEN_BUDGET", "AuditCallback", "AuditExample", "AuditPrediction", "AuditResult", "audit_guard",
           "summarize_values"]


class AuditCallback(ModelLookup, AuditSchedule, abc.ABC):
    """Base class of the audit callbacks: scheduling, audit subset, non-invasiveness, state, logging.

    Subclasses implement :meth:`audit_batch` (per-example results of one batch of the audit subset) and may
    override :meth:`aggregate` (scalars from all per-example results); everything else is shared, including the
    prediction step (:meth:`predict`: forward pass, softmax, argmax), whose result ``audit_batch`` receives.
    A subclass may define ``summary_rows(metrics, full) -> [(label, template)]`` to choose its rows of the final
    results table (:func:`lightning_xai.reporting.final_results`); reporting reads callbacks only through such
    attributes, so a new audit callback needs no change there.

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
            ``*-mixed``); ``"32"``: every map in float32. See :class:`~lightning_xai.callbacks.guard.AuditPrecision`.
        num_report_examples: how many audited examples keep their full maps for reports.
        strict: re-raise an exception raised inside a scheduled audit. By default (``False``) it is reported
            once per exception type (``rank_zero_warn``: the cause and what to try), the audit is skipped and
            training goes on, with every RNG, mode and gradient restored. Configuration errors found by the
            two-example probe before the first audit (:meth:`check_model`) always raise.
        model: which model of the LightningModule to explain (:mod:`~lightning_xai.callbacks.resolve`): ``None``
            finds it (the module itself, or the one ``transformers`` sequence classifier it holds), else an
            attribute path (``"model"``) or a callable ``pl_module -> model``. tokenizer: gives the words of
            reports and the special tokens (default: a ``tokenizer`` attribute of the module or DataModule).
        budget: share of training time the audits may take (0.05; ``None``: off): see :class:`AuditSchedule`.

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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "prediction" not in inspect.signature(cls.audit_batch).parameters:  # checked once, when the class is made
            raise TypeError(f"{cls.__name__}.audit_batch must take `prediction: Optional[AuditPrediction] = None` "
                            "(the shared prediction step's result; use `prediction or self.predict(model, batch)`).")

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
        self.init_lookup(model, tokenizer)
        check_cadence(f"{cls}(every_n_epochs)", every_n_epochs, allow_zero=True)
        check_cadence(f"{cls}(every_n_train_steps)", every_n_train_steps, allow_zero=False)
        if not every_n_epochs and not every_n_train_steps and not on_validate and not on_test:
            raise MisconfigurationException(
                f"{cls} would never run: set every_n_epochs >= 1, every_n_train_steps >= 1, on_validate or on_test.")
        check_audit_options(cls, num_samples=num_samples, dataloader=dataloader, batch_size=batch_size, seed=seed,
                            precision=precision, num_report_examples=num_report_examples, strict=strict)
        self.every_n_epochs = every_n_epochs or 0
        self.every_n_train_steps = every_n_train_steps
        self.init_budget(budget, num_samples)
        self.dataloader = dataloader
        self.batch_size = batch_size
        self.seed = seed
        self.on_validate = on_validate
        self.on_test = on_test
        self.log_prefix = log_prefix or self.name
        self.precision = precision
        self._precision = AuditPrecision(cls, precision)
        self.num_report_examples = num_report_examples
        self.strict = strict
        self._failures = AuditFailures(cls, strict)
        self._cost = AuditCost()
        self._runs = RunCounter()
        self.history: List[Dict[str, Any]] = []
        self.latest: Optional[AuditResult] = None
        self.version = 0  # bumps on every audit; reporters watch it
        self._subsets: Dict[str, List[int]] = {}
        self._batches: Dict[str, List[AuditBatch]] = {}
        self._warned_no_logger = False
        self._warned_undefined: Set[str] = set()
        self._checked = False
        self._last_step_audited: Optional[int] = None
        self._epoch_audited: Optional[int] = None
        self._aggregated: Optional[Dict[str, float]] = None

    # --- identity and state ---------------------------------------------------------------------------
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
                "subsets": {k: list(v) for k, v in self._subsets.items()}, "budget": self.budget_state()}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = restored_history(self.history, state_dict.get("history", []))
        self._runs.restored(self.history)
        saved = state_dict.get("subsets", {})
        self._restored_subsets = {k: list(v) for k, v in saved.items()}
        self.load_budget_state(state_dict.get("budget"))

    # --- setup: fail early on a model the audit cannot read -----------------------------------------------
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if trainer is not None:  # None: set up by hand (notebooks, tests)
            check_placement(self, [c for c in trainer.callbacks if isinstance(c, AuditCallback)], trainer, stage)
            if self._runs.enter(trainer, type(self).__name__):  # a new Trainer counts its epochs and steps from 0
                self._epoch_audited = self._last_step_audited = None
        self.explainable(pl_module)
        self._checked = False
        self._batches = {}

    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """Run the model on two audit examples and check what the audit needs (called before the first audit).

        The default checks that the protocol's forward pass runs and returns ``[B, C]`` logits and a ``[B, T]``
        attention, then runs the model's own ``probe(batch)`` when it has one (:class:`~lightning_xai.adapters.
        HookAdapter`: the attention module returns weights, and they feed the logits). Any failure is a
        :class:`MisconfigurationException` that names the cause, raised before training goes on.
        """
        model = self.explainable(pl_module)
        batches = self._audit_batches(trainer, split)
        if not batches:
            return
        _, _, batch = batches[0]
        batch = move_data_to_device(batch, pl_module.device)
        try:
            with audit_guard(pl_module):
                rows = model.token_mask(batch).shape[0]  # two examples show the shapes, without GBs of attention
                batch = gather_rows(batch, torch.arange(min(2, rows)), rows)
                out = self.predict(model, batch).output
                probe = getattr(model, "probe", None)
                if callable(probe):
                    probe(batch)
        except MisconfigurationException:
            raise
        except Exception as err:
            raise MisconfigurationException(
                f"{type(self).__name__} cannot audit this model: its probe on the {split!r} split failed "
                f"with {type(err).__name__}: {err}") from err
        mask = model.token_mask(batch)
        attention = getattr(out, "attention", None)
        if not isinstance(attention, Tensor) or attention.shape != mask.shape:
            shape = None if not isinstance(attention, Tensor) else tuple(attention.shape)
            raise MisconfigurationException(
                f"{type(self).__name__} needs the model's attention: forward_from_embeddings must return an "
                f"ExplainOutput whose `attention` is a [B, T] tensor matching token_mask {tuple(mask.shape)}; got "
                f"{shape}. Models without an attention layer cannot be audited for attention faithfulness.")
        logits = getattr(out, "logits", None)
        if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[0] != mask.shape[0]:
            raise MisconfigurationException(f"{type(self).__name__} needs [B, C] logits from forward_from_embeddings.")
        self.check_attention_override(model)

    def _ensure_checked(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        if not self._checked:
            self.check_model(trainer, pl_module, split)
            self._checked = True

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.every_n_epochs or self.every_n_train_steps:
            self._ensure_checked(trainer, pl_module, self.dataloader)

    # --- the audit subset ----------------------------------------------------------------------------------
    def _loader(self, trainer: "pl.Trainer", split: str) -> Any:
        return find_loader(trainer, split, type(self).__name__)

    def audit_indices(self, trainer: "pl.Trainer", split: str) -> List[int]:
        """The fixed audit subset of ``split``: ``num_samples`` dataset indices drawn once from ``seed`` (sorted)."""
        if split not in self._subsets:
            dataset = self._loader(trainer, split).dataset
            chosen = draw_subset(dataset, self.audit_size(trainer, split, self._loader(trainer, split)), self.seed,
                                 type(self).__name__, split)
            restored = getattr(self, "_restored_subsets", {}).get(split)
            if restored is not None and restored != chosen:
                rank_zero_warn(f"{type(self).__name__}: the {split!r} audit subset differs from the checkpoint's "
                               "(the dataset changed?); the resumed history mixes two subsets.")
            self._subsets[split] = chosen
        return self._subsets[split]

    def _audit_batches(self, trainer: "pl.Trainer", split: str) -> List[AuditBatch]:
        """This process's shard of the audit subset as collated CPU batches ``(positions, indices, batch)``."""
        if split not in self._batches:
            loader = self._loader(trainer, split)
            indices = self.audit_indices(trainer, split)
            positions = list(range(len(indices)))[trainer.global_rank::max(1, trainer.world_size)]
            self._batches[split] = build_batches(loader, indices, positions, self.batch_size, AUDIT_TOKEN_BUDGET,
                                                 type(self).__name__, split)
        return self._batches[split]

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
            try:
                with audit_guard(pl_module, seed=self.seed) as generator, \
                        self._precision.audit(trainer, pl_module) as context:
                    for positions, indices, cpu_batch in batches:
                        batch = move_data_to_device(cpu_batch, pl_module.device)
                        found, extra = self._measure(trainer, pl_module, model, batch, indices, generator, context)
                        aggregator.update(found.get("values", {}))
                        examples.extend(collect_examples(model.token_mask(batch), batch, positions, indices, split,
                                                         found, self.num_report_examples))
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
        try:
            metrics = self.aggregate(examples, merged)
        finally:
            self._aggregated = None
        warn_undefined(type(self).__name__, split, examples, metrics, self._warned_undefined)
        result = AuditResult(stage=stage, epoch=trainer.current_epoch, global_step=trainer.global_step, split=split,
                             metrics=metrics, examples=examples, extras=merged, run=self._runs.run)
        self.history = add_record(self.history, result.record())
        self._log(trainer, stage, metrics)
        self.latest = result
        self.version += 1
        return result

    def _measure(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", model: ExplainableModel,
                 batch: Dict[str, Any], indices: List[int], generator: torch.Generator, context: Any
                 ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        with precision_context(trainer, pl_module.device, context):
            prediction = self.predict(model, batch)
            with self._precision.maps(self.name, self.precision_sensitive):
                found, extra = audit_finite_rows(lambda b, i, p: self.audit_batch(
                    model, b, generator, i, prediction=p or self.predict(model, b)), batch, indices, prediction)
        return mark_undefined({"prediction": prediction.prediction, "probability": prediction.probability, **found},
                              prediction.finite, self.expected_values()), extra

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
                    ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Measure one batch (``indices``: the dataset indices of its rows; ``generator``: the audit's own RNG;
        ``prediction``: the shared prediction step's result — ``None`` when called directly, then use
        ``prediction or self.predict(model, batch)``).

        Returns:
            ``(found, extra)``: ``found`` holds optional ``maps`` ``{name: [B, T]}`` and ``values`` ``{name: [B]}``
            per-example scalars (``prediction``/``probability`` ``[B]`` come from the prediction step unless given
            here); ``extra`` is merged over batches (and processes) and passed to :meth:`aggregate`.
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

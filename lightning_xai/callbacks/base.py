"""The machinery every audit callback shares: when to run, on which examples, without touching training.

An audit callback runs a measurement on a *fixed audit subset* — the same ``num_samples`` examples of one
split every time, drawn once from ``seed`` — at a cadence (every ``n`` epochs at validation end and/or every
``n`` optimizer steps), and in ``trainer.validate``/``trainer.test``. It is *non-invasive*: it saves and
restores the global RNGs (python, numpy, torch, CUDA), every module's train/eval mode, every parameter's
``requires_grad`` and ``.grad``, and works under Lightning's ``no_grad`` validation and the ``inference_mode`` of
``validate``/``test``. Under DDP each process audits its shard of the subset; per-example results are gathered
so every process holds (and logs) the numbers one process would compute. Results go to every logger, to
``callback.history`` (checkpointed, so a resumed run continues it), and to ``callback.latest`` (per-example detail
for :mod:`lightning_xai.reporting`).
"""
from __future__ import annotations

import abc
import contextlib
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel, ProtocolError, as_explainable

__all__ = ["AuditCallback", "AuditExample", "AuditResult", "audit_guard", "summarize_values"]

SPLITS = ("train", "val", "test")
#: padded tokens (rows × width) up to which the audit joins loader-sized batches when ``batch_size=None``
AUDIT_TOKEN_BUDGET = 8192


def summarize_values(values: Sequence[float], p_values: Optional[Sequence[float]] = None,
                     alpha: float = 0.05) -> Dict[str, float]:
    """Mean, standard deviation (population, as ``numpy.std``), count and — given p-values — the fraction
    with ``p <= alpha`` of per-example values. NaNs (undefined instances, e.g. τ of a one-token text) are left
    out of the mean/std and counted in ``undefined``.

    Example:
        >>> {k: round(v, 6) for k, v in summarize_values([0.2, 0.4, float("nan")], [0.01, 0.5, float("nan")]).items()}
        {'mean': 0.3, 'std': 0.1, 'count': 2, 'undefined': 1, 'significant_fraction': 0.5}
    """
    arr = np.asarray(list(values), dtype=np.float64)
    ok = ~np.isnan(arr)
    out: Dict[str, float] = {
        "mean": float(arr[ok].mean()) if ok.any() else float("nan"),
        "std": float(arr[ok].std()) if ok.any() else float("nan"),
        "count": int(ok.sum()),
        "undefined": int((~ok).sum()),
    }
    if p_values is not None:
        p = np.asarray(list(p_values), dtype=np.float64)[ok]
        out["significant_fraction"] = float((p <= alpha).mean()) if p.size else float("nan")
    return out


@dataclass
class AuditExample:
    """One audited example, as the reports show it.

    Attributes:
        position: position in the audit subset (the order every process agrees on).
        index: index of the example in its split (``dataset[index]``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        token_ids: ids of the real tokens (``batch["mask"]`` positions), in order.
        label: gold class (``None`` if the batch has no labels).
        prediction: predicted class.
        probability: probability of the predicted class.
        maps: per-method token scores over the real tokens (same length as ``token_ids``).
        values: per-example scalar results, e.g. ``{"kendall_tau/attention~gradient": 0.31}``.
        tokens: the words (filled by :meth:`AuditCallback.example_tokens`; ``None`` until then).
    """

    position: int
    index: int
    split: str
    token_ids: List[int]
    label: Optional[int]
    prediction: int
    probability: float
    maps: Dict[str, List[float]] = field(default_factory=dict)
    values: Dict[str, float] = field(default_factory=dict)
    tokens: Optional[List[str]] = None


@dataclass
class AuditResult:
    """The outcome of one audit run: aggregated scalars plus per-example detail."""

    stage: str
    epoch: int
    global_step: int
    split: str
    metrics: Dict[str, float]
    examples: List[AuditExample]
    extras: Dict[str, Any] = field(default_factory=dict)

    def record(self) -> Dict[str, Any]:
        """The checkpointable summary kept in :attr:`AuditCallback.history`."""
        return {"stage": self.stage, "epoch": self.epoch, "global_step": self.global_step, "split": self.split,
                "num_examples": len(self.examples), "metrics": dict(self.metrics)}


@contextlib.contextmanager
def audit_guard(module: torch.nn.Module, seed: Optional[int] = None) -> Iterator[torch.Generator]:
    """Run an audit without leaving a trace on training.

    Saves and restores the python, numpy, torch and CUDA RNG states, every submodule's ``training`` flag, every
    parameter's ``requires_grad`` and ``.grad``; puts the module in ``eval()``; leaves ``inference_mode`` and
    enables gradients (audits differentiate w.r.t. embeddings). Yields a private ``torch.Generator`` seeded with
    ``seed`` for the audit's own randomness.

    Example:
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout()).train()
        >>> state = torch.get_rng_state()
        >>> with audit_guard(net, seed=0) as gen:
        ...     _ = torch.rand(3)                 # consumes the global RNG ...
        ...     net.training, torch.is_grad_enabled()
        (False, True)
        >>> torch.equal(torch.get_rng_state(), state), net.training   # ... which is restored
        (True, True)
    """
    py_state = random.getstate()
    np_state = np.random.get_state()
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    modes = [(m, m.training) for m in module.modules()]
    params = list(module.parameters())
    flags = [p.requires_grad for p in params]
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    generator = torch.Generator()
    if seed is not None:
        generator.manual_seed(seed)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            module.eval()
            yield generator
    finally:
        for m, training in modes:
            m.training = training
        for p, flag, grad in zip(params, flags, grads):
            if p.requires_grad != flag:
                p.requires_grad_(flag)
            p.grad = grad
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def _check_cadence(name: str, value: Optional[int], allow_zero: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise MisconfigurationException(
            f"{name} must be {'a non-negative' if allow_zero else 'a positive'} int or None, got {value!r}.")


class AuditCallback(Callback, abc.ABC):
    """Base class of the audit callbacks: scheduling, audit subset, non-invasiveness, state, logging.

    Subclasses implement :meth:`audit_batch` (per-example results of one batch of the audit subset) and
    :meth:`aggregate` (scalars from all per-example results); everything else is shared.

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
        precision: ``"trainer"`` runs the audit's forward passes under the trainer's precision context
            (autocast for ``*-mixed``), ``"32"`` disables autocast so maps are computed in float32.
        num_report_examples: how many audited examples keep their full maps for reports.
    """

    name: str = "audit"

    def __init__(
        self,
        *,
        every_n_epochs: Optional[int] = 1,
        every_n_train_steps: Optional[int] = None,
        num_samples: Optional[int] = 256,
        dataloader: str = "val",
        batch_size: Optional[int] = None,
        seed: int = 0,
        on_validate: bool = True,
        on_test: bool = True,
        log_prefix: Optional[str] = None,
        precision: str = "trainer",
        num_report_examples: int = 16,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        _check_cadence(f"{cls}(every_n_epochs)", every_n_epochs, allow_zero=True)
        _check_cadence(f"{cls}(every_n_train_steps)", every_n_train_steps, allow_zero=False)
        if not every_n_epochs and not every_n_train_steps and not on_validate and not on_test:
            raise MisconfigurationException(
                f"{cls} would never run: set every_n_epochs >= 1, every_n_train_steps >= 1, on_validate or on_test.")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                        or num_samples < 1):
            raise MisconfigurationException(f"{cls}(num_samples) must be a positive int or None (whole split), "
                                            f"got {num_samples!r}.")
        if dataloader not in SPLITS:
            raise MisconfigurationException(f"{cls}(dataloader) must be one of {SPLITS}, got {dataloader!r}.")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise MisconfigurationException(f"{cls}(batch_size) must be a positive int or None, got {batch_size!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise MisconfigurationException(f"{cls}(seed) must be an int, got {seed!r}.")
        if precision not in ("trainer", "32"):
            raise MisconfigurationException(f"{cls}(precision) must be 'trainer' or '32', got {precision!r}.")
        if not isinstance(num_report_examples, int) or num_report_examples < 0:
            raise MisconfigurationException(f"{cls}(num_report_examples) must be an int >= 0, "
                                            f"got {num_report_examples!r}.")
        self.every_n_epochs = every_n_epochs or 0
        self.every_n_train_steps = every_n_train_steps
        self.num_samples = num_samples
        self.dataloader = dataloader
        self.batch_size = batch_size
        self.seed = seed
        self.on_validate = on_validate
        self.on_test = on_test
        self.log_prefix = log_prefix or self.name
        self.precision = precision
        self.num_report_examples = num_report_examples
        self.history: List[Dict[str, Any]] = []
        self.latest: Optional[AuditResult] = None
        self.version = 0  # bumps on every audit; reporters watch it
        self._subsets: Dict[str, List[int]] = {}
        self._batches: Dict[str, List[Tuple[List[int], List[int], Dict[str, Any]]]] = {}
        self._warned_no_logger = False
        self._checked = False
        self._last_step_audited: Optional[int] = None
        self._epoch_audited: Optional[int] = None

    # --- identity and state ---------------------------------------------------------------------------
    def _state_config(self) -> Dict[str, Any]:
        """Settings that tell two instances of a callback class apart (extended by subclasses)."""
        return {"every_n_epochs": self.every_n_epochs, "every_n_train_steps": self.every_n_train_steps,
                "num_samples": self.num_samples, "dataloader": self.dataloader, "seed": self.seed}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(**self._state_config())

    @override
    def state_dict(self) -> Dict[str, Any]:
        return {"history": [dict(r, metrics=dict(r["metrics"])) for r in self.history],
                "subsets": {k: list(v) for k, v in self._subsets.items()}}

    @override
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.history = [dict(r, metrics=dict(r["metrics"])) for r in state_dict.get("history", [])]
        saved = state_dict.get("subsets", {})
        self._restored_subsets = {k: list(v) for k, v in saved.items()}

    # --- setup: fail early on a model the audit cannot read -----------------------------------------------
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self.explainable(pl_module)
        self._checked = False
        self._batches = {}

    def explainable(self, pl_module: "pl.LightningModule") -> ExplainableModel:
        """The module seen through the protocol, or a :class:`MisconfigurationException` saying how to fix it."""
        try:
            return as_explainable(pl_module)
        except ProtocolError as err:
            raise MisconfigurationException(f"{type(self).__name__} cannot audit this model: {err}") from err

    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """Run the model on one audit example and check what the audit needs (called before the first audit).

        The default checks that the protocol's forward pass returns ``[B, C]`` logits and a ``[B, T]`` attention.
        """
        model = self.explainable(pl_module)
        batches = self._audit_batches(trainer, split)
        if not batches:
            return
        _, _, batch = batches[0]
        batch = move_data_to_device(batch, pl_module.device)
        with audit_guard(pl_module), torch.no_grad():
            out = model.forward_from_embeddings(model.embed(batch), batch)
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
        datamodule = getattr(trainer, "datamodule", None)
        loader = None
        if datamodule is not None and hasattr(datamodule, f"{split}_dataloader"):
            try:
                loader = getattr(datamodule, f"{split}_dataloader")()
            except (MisconfigurationException, ValueError):
                loader = None
        if loader is None:
            loader = {"train": lambda: trainer.train_dataloader, "val": lambda: trainer.val_dataloaders,
                      "test": lambda: trainer.test_dataloaders}[split]()
            if loader is None and split == "val":
                # During fit the validation loaders are loaded lazily; ask the loop's data source.
                source = getattr(getattr(trainer.fit_loop.epoch_loop, "val_loop", None), "_data_source", None)
                if source is not None and source.is_defined():
                    loader = source.dataloader()
            if loader is None and split == "train":
                source = getattr(trainer.fit_loop, "_data_source", None)
                if source is not None and source.is_defined():
                    loader = source.dataloader()
        if isinstance(loader, (list, tuple)):
            loader = loader[0] if loader else None
        if isinstance(loader, dict):
            loader = next(iter(loader.values()), None)
        if loader is None:
            raise MisconfigurationException(
                f"{type(self).__name__} found no {split!r} dataloader to audit; pass a datamodule with "
                f"{split}_dataloader() or set dataloader= to a split the trainer has.")
        return loader

    def audit_indices(self, trainer: "pl.Trainer", split: str) -> List[int]:
        """The fixed audit subset of ``split``: ``num_samples`` dataset indices drawn once from ``seed`` (sorted)."""
        if split not in self._subsets:
            dataset = self._loader(trainer, split).dataset
            if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
                raise MisconfigurationException(
                    f"{type(self).__name__} needs a map-style dataset (with __len__ and __getitem__) for its fixed "
                    f"audit subset; the {split!r} dataloader has {type(dataset).__name__}.")
            size = len(dataset)
            count = size if self.num_samples is None else min(self.num_samples, size)
            generator = torch.Generator().manual_seed(self.seed)
            chosen = sorted(torch.randperm(size, generator=generator)[:count].tolist())
            restored = getattr(self, "_restored_subsets", {}).get(split)
            if restored is not None and restored != chosen:
                rank_zero_warn(f"{type(self).__name__}: the {split!r} audit subset differs from the checkpoint's "
                               "(the dataset changed?); the resumed history mixes two subsets.")
            self._subsets[split] = chosen
        return self._subsets[split]

    def _audit_batches(self, trainer: "pl.Trainer", split: str) -> List[Tuple[List[int], List[int], Dict[str, Any]]]:
        """This process's shard of the audit subset as collated CPU batches ``(positions, indices, batch)``."""
        if split not in self._batches:
            loader = self._loader(trainer, split)
            indices = self.audit_indices(trainer, split)
            positions = list(range(len(indices)))[trainer.global_rank::max(1, trainer.world_size)]
            collate = getattr(loader, "collate_fn", None)
            if collate is None:
                raise MisconfigurationException(f"{type(self).__name__}: the {split!r} dataloader has no collate_fn.")
            size = self.batch_size or getattr(loader, "batch_size", None) or 32
            with torch.inference_mode(False):  # tensors built in validate/test must not be inference tensors
                groups = [positions[start:start + size] for start in range(0, len(positions), size)]
                if self.batch_size is None:
                    groups = self._merge_small_batches(groups, indices, loader)
                batches = [(pos, [indices[p] for p in pos], collate([loader.dataset[indices[p]] for p in pos]))
                           for pos in groups]
            self._batches[split] = batches
        return self._batches[split]

    @staticmethod
    def _merge_small_batches(groups: List[List[int]], indices: List[int], loader: Any) -> List[List[int]]:
        """Join consecutive loader-sized groups while the padded batch stays within ``AUDIT_TOKEN_BUDGET`` tokens.

        Fewer, larger passes make the audit faster (per-pass overhead dominates small batches of short texts)
        while long documents keep the loader's batch size, so memory stays bounded.
        """
        def width(pos: List[int]) -> int:
            batch = loader.collate_fn([loader.dataset[indices[p]] for p in pos])
            widths = [v.shape[1] for v in batch.values() if isinstance(v, Tensor) and v.dim() >= 2]
            return max(widths, default=1)

        merged: List[List[int]] = []
        current: List[int] = []
        current_width = 0
        for group in groups:
            group_width = width(group)
            joined_width = max(current_width, group_width)
            if current and (len(current) + len(group)) * joined_width > AUDIT_TOKEN_BUDGET:
                merged.append(current)
                current, joined_width = [], group_width
            current = current + group
            current_width = joined_width
        if current:
            merged.append(current)
        return merged

    # --- scheduling ----------------------------------------------------------------------------------------
    @override
    def on_validation_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if trainer.sanity_checking:
            return
        fn = trainer.state.fn
        if fn == "fit":
            self._epoch_audit(trainer, pl_module)
        elif fn == "validate" and self.on_validate:
            self.run_audit(trainer, pl_module, "validate", "val")

    def _epoch_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        epoch = trainer.current_epoch
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0 and self._epoch_audited != epoch:
            self._epoch_audited = epoch
            self.run_audit(trainer, pl_module, "fit", self.dataloader)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # Runs after the epoch's validation: audits here only when no validation ran this epoch.
        self._epoch_audit(trainer, pl_module)

    @override
    def on_test_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.on_test:
            self.run_audit(trainer, pl_module, "test", "test")

    @override
    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        n = self.every_n_train_steps
        step = trainer.global_step
        if n and step > 0 and step % n == 0 and step != self._last_step_audited:
            self._last_step_audited = step
            self.run_audit(trainer, pl_module, "fit", self.dataloader)

    # --- running ------------------------------------------------------------------------------------------
    def _precision_context(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> Any:
        if self.precision == "32":
            return torch.autocast(device_type=pl_module.device.type, enabled=False)
        return trainer.precision_plugin.forward_context()

    def run_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str) -> AuditResult:
        """Audit the fixed subset of ``split`` now, log the scalars and append them to :attr:`history`."""
        self._ensure_checked(trainer, pl_module, split)
        model = self.explainable(pl_module)
        examples: List[AuditExample] = []
        extras: List[Dict[str, Any]] = []
        batches = self._audit_batches(trainer, split)
        bar = self._progress_bar(trainer, len(batches), split)
        try:
            with audit_guard(pl_module, seed=self.seed) as generator:
                for positions, indices, cpu_batch in batches:
                    batch = move_data_to_device(cpu_batch, pl_module.device)
                    with self._precision_context(trainer, pl_module):
                        found, extra = self.audit_batch(model, batch, generator, indices)
                    examples.extend(self._examples(model, batch, positions, indices, split, found))
                    extras.append(extra)
                    if bar is not None:
                        bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        examples = self._gather(trainer, examples)
        merged = self._merge_extras(trainer, extras)
        metrics = self.aggregate(examples, merged)
        result = AuditResult(stage=stage, epoch=trainer.current_epoch, global_step=trainer.global_step, split=split,
                             metrics=metrics, examples=examples, extras=merged)
        self._add_record(result.record())
        self._log(trainer, pl_module, stage, metrics)
        self.latest = result
        self.version += 1
        return result

    def _progress_bar(self, trainer: "pl.Trainer", total: int, split: str) -> Any:
        """Lightning's tqdm bar for the audit, shown (rank zero, progress bar enabled) once it takes over 2 s."""
        progress = trainer.progress_bar_callback
        if progress is None or not trainer.is_global_zero or not getattr(progress, "is_enabled", False):
            return None
        try:
            from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm
        except ImportError:  # pragma: no cover - Lightning without tqdm
            return None
        return Tqdm(total=total, desc=f"{type(self).__name__} ({split})", leave=False, delay=2.0, dynamic_ncols=True,
                    file=sys.stderr, unit="batch")

    def _examples(self, model: ExplainableModel, batch: Dict[str, Any], positions: List[int], indices: List[int],
                  split: str, found: Dict[str, Any]) -> List[AuditExample]:
        mask = model.token_mask(batch).detach().cpu()
        ids = batch["input_ids"].detach().cpu() if "input_ids" in batch else None
        labels = batch.get("labels")
        labels = labels.detach().cpu().tolist() if isinstance(labels, Tensor) else [None] * len(indices)
        pred = found["prediction"].detach().cpu().tolist()
        prob = found["probability"].detach().float().cpu().tolist()
        maps = {k: v.detach().float().cpu() for k, v in found.get("maps", {}).items()}
        values = {k: v.detach().double().cpu().tolist() for k, v in found.get("values", {}).items()}
        out = []
        for row, (pos, index) in enumerate(zip(positions, indices)):
            real = mask[row]
            keep_maps = pos < self.num_report_examples
            out.append(AuditExample(
                position=pos, index=index, split=split,
                token_ids=ids[row][real].tolist() if ids is not None else list(range(int(real.sum()))),
                label=labels[row], prediction=int(pred[row]), probability=float(prob[row]),
                maps={k: v[row][real].tolist() for k, v in maps.items()} if keep_maps else {},
                values={k: float(v[row]) for k, v in values.items()}))
        return out

    def _gather(self, trainer: "pl.Trainer", examples: List[AuditExample]) -> List[AuditExample]:
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered: List[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, examples)
            examples = [e for part in gathered for e in part]
        return sorted(examples, key=lambda e: e.position)

    def _merge_extras(self, trainer: "pl.Trainer", extras: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Combine the per-batch ``extra`` dicts of :meth:`audit_batch` (lists are concatenated, across ranks too)."""
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered: List[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, extras)
            extras = [e for part in gathered for e in part]
        merged: Dict[str, Any] = {}
        for extra in extras:
            for key, value in extra.items():
                merged.setdefault(key, []).extend(value if isinstance(value, list) else [value])
        return merged

    def _add_record(self, record: Dict[str, Any]) -> None:
        key = (record["stage"], record["epoch"], record["global_step"], record["split"])
        self.history = [r for r in self.history if (r["stage"], r["epoch"], r["global_step"], r["split"]) != key]
        self.history.append(record)

    def _log(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str,
             metrics: Dict[str, float]) -> None:
        prefix = self.log_prefix if stage == "fit" else f"{stage}/{self.log_prefix}"
        flat = {f"{prefix}/{k}": float(v) for k, v in metrics.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if not trainer.loggers:
            if not self._warned_no_logger:
                rank_zero_warn(f"{type(self).__name__}: the trainer has no logger; audit results are kept in "
                               "callback.history (and written by lightning_xai.reporting.AuditReport if present).")
                self._warned_no_logger = True
            return
        for logger in trainer.loggers:  # loggers are rank-zero only by construction
            logger.log_metrics({k: v for k, v in flat.items() if not math.isnan(v)}, step=trainer.global_step)

    # --- what subclasses implement ------------------------------------------------------------------------
    def example_generators(self, indices: Sequence[int]) -> List[torch.Generator]:
        """One CPU generator per example, seeded from ``seed`` and the example's dataset index: randomness that
        does not depend on how the audit subset is batched or sharded across processes."""
        return [torch.Generator().manual_seed((self.seed * 1_000_003 + int(i)) % (2 ** 63)) for i in indices]

    @abc.abstractmethod
    def audit_batch(self, model: ExplainableModel, batch: Dict[str, Any], generator: torch.Generator,
                    indices: List[int]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Measure one batch (``indices``: the dataset indices of its rows; ``generator``: the audit's own RNG).

        Returns:
            ``(found, extra)``: ``found`` holds ``prediction`` ``[B]``, ``probability`` ``[B]``, optional ``maps``
            ``{name: [B, T]}`` and ``values`` ``{name: [B]}`` per-example scalars; ``extra`` is merged over
            batches (and processes) and passed to :meth:`aggregate`.
        """

    def aggregate(self, examples: List[AuditExample], extras: Dict[str, Any]) -> Dict[str, float]:
        """Scalars to log from every audited example (the same on every process)."""
        out: Dict[str, float] = {}
        names = sorted({k for e in examples for k in e.values if not k.endswith("/p_value")})
        for name in names:
            values = [e.values.get(name, float("nan")) for e in examples]
            p_name = f"{name}/p_value"
            p_values = [e.values.get(p_name, float("nan")) for e in examples] if any(
                p_name in e.values for e in examples) else None
            for stat, value in summarize_values(values, p_values).items():
                if stat in ("mean", "std", "significant_fraction"):
                    out[f"{name}/{stat}"] = value
        return out

    def histogram_keys(self, examples: List[AuditExample]) -> List[str]:
        """Per-example values whose histogram the reports draw (default: all but p-values)."""
        keys: List[str] = []
        for example in examples:
            keys.extend(k for k in example.values if k not in keys and not k.endswith("/p_value"))
        return keys

    # --- tokens for reports ----------------------------------------------------------------------------------
    @staticmethod
    def example_tokens(trainer: Optional["pl.Trainer"], pl_module: Any, example: AuditExample) -> List[str]:
        """The words of an audited example: from ``trainer.datamodule.tokens(split, index)``, else from the
        model's ``vocab`` list, else the ids as strings."""
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        if datamodule is not None and callable(getattr(datamodule, "tokens", None)):
            try:
                words = list(datamodule.tokens(example.split, example.index))
                if len(words) == len(example.token_ids):
                    return [str(w) for w in words]
            except (IndexError, KeyError, ValueError):
                pass
        vocab = getattr(pl_module, "vocab", None)
        if isinstance(vocab, (list, tuple)) and all(0 <= i < len(vocab) for i in example.token_ids):
            return [str(vocab[i]) for i in example.token_ids]
        return [str(i) for i in example.token_ids]

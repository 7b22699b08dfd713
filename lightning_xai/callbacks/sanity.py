"""The :class:`SanityCheck` callback: are the saliency methods you audit with reliable *for this model*?

It runs :mod:`lightning_xai.audits.sanity` on a fixed audit subset — Kindermans et al.'s input invariance,
Adebayo et al.'s parameter randomisation and IG completeness / LRP conservation — and logs, per method, the
fraction of examples passing input invariance, the mean rank correlation to the randomised model's map, and the
mean completeness error. By default it runs once, when ``fit`` ends (the checks re-run every method on copies
of the model, so they are too costly for every epoch); ``every_n_epochs`` and ``trainer.validate``/``test``
runs are available as for every audit callback.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.audits.input_invariance import input_shift_refusal
from lightning_xai.audits.sanity import (
    DEFAULT_INVARIANCE_METHODS,
    DEFAULT_RANDOMIZATION_METHODS,
    MethodSpec,
    SanityTable,
    run_sanity_checks,
)
from lightning_xai.callbacks._audit.distributed import agreed
from lightning_xai.callbacks.base import AuditCallback, AuditPrediction, BatchResult

__all__ = ["SanityCheck", "SANITY_CHECKS"]

SANITY_CHECKS = ("input_invariance", "model_randomization", "completeness")


class SanityCheck(AuditCallback):
    """Saliency sanity checks on a fixed subset, logged under ``sanity/<check>/<method>/...``.

    Logged keys (each ``/mean`` and ``/std`` over the audited examples):
    ``sanity/input_invariance/<method>/passes`` (fraction whose map is unchanged by the shift),
    ``.../relative_change``; ``sanity/model_randomization/<mode>/<stage>/<method>/tau``;
    ``sanity/completeness/<method>/relative_error``. The full tables of the latest run are in :attr:`tables`
    (one dict of :class:`~lightning_xai.audits.sanity.SanityTable` per audited batch).

    Args:
        checks: which of ``input_invariance``, ``model_randomization``, ``completeness`` to run.
        invariance_methods / randomization_methods: methods (names or ``(label, method, options)``).
        randomization_mode: ``"cascading"`` or ``"independent"``.
        ig_steps: IG step counts checked for completeness.
        tolerance: input invariance passes when a map changes by at most this (relative L2).
        at_fit_end: run once when ``fit`` ends (default True).
        every_n_epochs: also run after every n-th validation epoch of ``fit`` (default 0: never).
        num_samples: size of the fixed audit subset (default 32).
        **kwargs: the :class:`~lightning_xai.callbacks.base.AuditCallback` options (``dataloader``,
            ``batch_size``, ``seed``, ``on_validate``, ``on_test``, ...).

    Example:
        >>> callback = SanityCheck(checks=["input_invariance"], invariance_methods=["gradient", "grad_x_input"])
        >>> callback.checks
        ('input_invariance',)
    """

    name = "sanity"
    refuses_generation = (
        "its input-invariance check needs the EmbeddingShift capability, and its randomisation "
        "and completeness checks have not been made to explain a target sequence"
    )

    def __init__(
        self,
        checks: Sequence[str] = SANITY_CHECKS,
        *,
        invariance_methods: Sequence[MethodSpec] = DEFAULT_INVARIANCE_METHODS,
        randomization_methods: Sequence[MethodSpec] = DEFAULT_RANDOMIZATION_METHODS,
        randomization_mode: str = "cascading",
        ig_steps: Sequence[int] = (8, 32),
        tolerance: float = 1e-3,
        at_fit_end: bool = True,
        every_n_epochs: Optional[int] = 0,
        num_samples: Optional[int] = 32,
        on_validate: bool = False,
        on_test: bool = False,
        **kwargs: Any,
    ) -> None:
        checks_given, checks = checks, tuple(checks)
        unknown = [c for c in checks if c not in SANITY_CHECKS]
        if not checks or unknown:
            raise MisconfigurationException(
                f"SanityCheck(checks) must name some of {list(SANITY_CHECKS)}; got {list(checks)}."
            )
        if randomization_mode not in ("cascading", "independent"):
            raise MisconfigurationException(
                f"SanityCheck(randomization_mode) must be 'cascading' or 'independent', got {randomization_mode!r}."
            )
        if not tolerance > 0:
            raise MisconfigurationException(f"SanityCheck(tolerance) must be > 0, got {tolerance!r}.")
        steps = list(ig_steps)
        if not steps or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps):
            raise MisconfigurationException(f"SanityCheck(ig_steps) must be positive ints, got {ig_steps!r}.")
        if not (at_fit_end or every_n_epochs or on_validate or on_test or kwargs.get("every_n_train_steps")):
            raise MisconfigurationException(
                "SanityCheck would never run: set at_fit_end, every_n_epochs, "
                "every_n_train_steps, on_validate or on_test."
            )
        # the base class insists on a trigger of its own (at_fit_end is ours): satisfy it, then set the real flag
        super().__init__(
            every_n_epochs=every_n_epochs, num_samples=num_samples, on_validate=True, on_test=on_test, **kwargs
        )
        self.on_validate = on_validate
        self.checks: Tuple[str, ...] = checks
        self._explicit_checks = checks_given is not SANITY_CHECKS  # the default skips what a model cannot take
        self._skipped: Tuple[str, ...] = ()  # checks the model cannot take, found before the first audit
        self.invariance_methods = list(invariance_methods)
        self.randomization_methods = list(randomization_methods)
        self.randomization_mode = randomization_mode
        self.ig_steps = tuple(steps)
        self.tolerance = tolerance
        self.at_fit_end = at_fit_end
        self.tables: List[Dict[str, SanityTable]] = []

    def _state_config(self) -> Dict[str, Any]:
        return {**super()._state_config(), "checks": self.checks}

    @override
    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        """The base probe, then whether the model can take the input-invariance check (its embeddings shifted with
        compensation): if not, an explicit ``checks=[..., "input_invariance"]`` is refused by name; the default
        checks skip it with one warning and run the others."""
        super().check_model(trainer, pl_module, split)
        self._skipped = ()
        refusal = input_shift_refusal(self.explainable(pl_module)) if "input_invariance" in self.checks else None
        if refusal is None:
            return
        others = tuple(c for c in self.checks if c != "input_invariance")
        if self._explicit_checks:
            raise MisconfigurationException(
                f"SanityCheck(checks={list(self.checks)}): {refusal.rstrip('.')}. Leave 'input_invariance' out of "
                f"checks= (e.g. checks={list(others) or ['model_randomization', 'completeness']})."
            )
        rank_zero_warn(
            f"SanityCheck: the input-invariance check is skipped: {refusal.rstrip('.')}. The other checks run; "
            f"pass checks={list(others)} to say so and silence this warning."
        )
        self._skipped = ("input_invariance",)

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        super().on_fit_start(trainer, pl_module)
        if self.at_fit_end and not (self.every_n_epochs or self.every_n_train_steps):  # refused before training
            agreed(trainer, self._ensure_checked, trainer, pl_module, self.dataloader)

    @override
    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self.at_fit_end:
            self._scheduled_audit(trainer, pl_module, "fit", self.dataloader)

    @override
    def run_audit(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str, split: str) -> Any:
        self.tables = []
        return super().run_audit(trainer, pl_module, stage, split)

    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: Optional[List[int]] = None,
        prediction: Optional[AuditPrediction] = None,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        tables = self._run(model, batch)
        self.tables.append(tables)
        values = {
            f"{check}/{key}": value for check, table in tables.items() for key, value in table.per_example.items()
        }
        return BatchResult(values=values), {}

    def _run(self, model: ExplainableModel, batch: Dict[str, Any]) -> Dict[str, SanityTable]:
        checks = tuple(c for c in self.checks if c not in self._skipped)
        options: Dict[str, Any] = {}
        if "input_invariance" in checks:
            options.update(
                input_invariance_methods=self.invariance_methods,
                input_invariance_tolerance=self.tolerance,
                input_invariance_seed=self.seed,
            )
        if "model_randomization" in checks:
            options.update(
                model_randomization_methods=self.randomization_methods,
                model_randomization_mode=self.randomization_mode,
                model_randomization_seed=self.seed,
            )
        if "completeness" in checks:
            options.update(completeness_n_steps=self.ig_steps)
        return run_sanity_checks(model, batch, checks=checks, **options)

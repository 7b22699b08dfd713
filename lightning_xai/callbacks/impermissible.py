"""Attention mass on impermissible tokens (Pruthi et al., 2020), tracked while a model trains."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.adapters.protocol import ExplainableModel
from lightning_xai.callbacks._audit.failures import defined_examples
from lightning_xai.callbacks.base import AuditCallback, AuditExample, AuditPrediction, BatchResult
from lightning_xai.metrics import summarize_values
from lightning_xai.metrics.functional.plausibility import impermissible_mass

__all__ = ["ImpermissibleAttentionMonitor"]


class ImpermissibleAttentionMonitor(AuditCallback):
    """Attention mass ``Σ_{i∈I} α_i`` on the impermissible tokens ``I`` (batch key ``impermissible``).

    A deceptive model (Pruthi et al., 2020) keeps its accuracy while driving this mass towards 0 although it still
    uses those tokens. Logged: mean/std/max of the mass over the audit subset, the fraction of examples with mass
    below ``threshold`` and the audit subset's accuracy.

    Args:
        key: batch key of the ``[B, T]`` bool mask of impermissible tokens.
        threshold: report the fraction of examples whose mass is below it.
        **kwargs: scheduling and subset options of :class:`~lightning_xai.callbacks.AuditCallback`.

    Example:
        >>> ImpermissibleAttentionMonitor(threshold=2.0)
        Traceback (most recent call last):
        ...
        lightning_fabric.utilities.exceptions.MisconfigurationException: ImpermissibleAttentionMonitor(threshold) must lie in (0, 1], got 2.0.
    """

    name = "impermissible_attention"

    def __init__(self, key: str = "impermissible", threshold: float = 0.01, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(key, str) or not key:
            raise MisconfigurationException(f"ImpermissibleAttentionMonitor(key) must be a batch key, got {key!r}.")
        if not (0.0 < float(threshold) <= 1.0):
            raise MisconfigurationException(
                f"ImpermissibleAttentionMonitor(threshold) must lie in (0, 1], got {threshold!r}."
            )
        self.key = key
        self.threshold = float(threshold)

    def _state_config(self) -> Dict[str, Any]:
        return dict(super()._state_config(), key=self.key)

    def check_model(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", split: str) -> None:
        super().check_model(trainer, pl_module, split)
        batches = self._audit_batches(trainer, split)
        if batches and self.key not in batches[0][2]:
            raise MisconfigurationException(
                f"ImpermissibleAttentionMonitor: the {split!r} batches have no {self.key!r} key (found "
                f"{sorted(batches[0][2])}). It needs a [B, T] bool mask of impermissible tokens, e.g. the bundled "
                "'sst_wiki', 'pronoun' or 'occupation' datasets of TextClassificationDataModule; or set key=."
            )
        if not batches:
            return
        mask = batches[0][2][self.key]
        positions = tuple(self.explainable(pl_module).token_mask(batches[0][2]).shape)  # a batch may have no "mask"
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != positions:
            raise MisconfigurationException(
                f"ImpermissibleAttentionMonitor: batch[{self.key!r}] must be a bool tensor [B, T] over the model's "
                f"token positions {positions}, got {getattr(mask, 'dtype', type(mask).__name__)} "
                f"{tuple(getattr(mask, 'shape', ()))}."
            )

    def audit_batch(
        self,
        model: ExplainableModel,
        batch: Dict[str, Any],
        generator: torch.Generator,
        indices: List[int],
        prediction: Optional[AuditPrediction] = None,
    ) -> Tuple[BatchResult, Dict[str, Any]]:
        prediction = prediction or self.predict(model, batch)
        if self.key not in batch:
            raise MisconfigurationException(f"ImpermissibleAttentionMonitor: the batch has no {self.key!r} key.")
        attention = prediction.attention
        mass = impermissible_mass(attention, batch[self.key])
        return BatchResult(
            maps={"attention": attention, "impermissible": batch[self.key].float()}, values={"mass": mass}
        ), {}

    def summary_rows(self, metrics: Mapping[str, float], full: bool = False) -> List[Tuple[str, str]]:
        """The final table's row: the attention mass on impermissible tokens (mean ± std).

        Example:
            >>> ImpermissibleAttentionMonitor().summary_rows({})
            [('attention mass on impermissible tokens', '{mass:mean_std}')]
        """
        return [("attention mass on impermissible tokens", "{mass:mean_std}")]

    def aggregate(self, examples: List[AuditExample], extras: Dict[str, Any]) -> Dict[str, float]:
        if not examples:
            return {}
        examples = defined_examples(examples)  # rows with non-finite logits: no prediction, their mass left out
        if not examples:
            return {"mass/mean": float("nan"), "accuracy": float("nan")}
        labelled = [e for e in examples if e.label is not None]
        mass = np.array([e.values["mass"] for e in examples], dtype=np.float64)
        summary = summarize_values(mass.tolist())  # the torchmetrics ValueMean every audit averages with
        out = {
            "mass/mean": summary["mean"],
            "mass/std": summary["std"],
            "mass/max": float(mass.max()),
            f"mass/below_{self.threshold:g}": float((mass < self.threshold).mean()),
        }
        if labelled:
            out["accuracy"] = float(np.mean([e.prediction == e.label for e in labelled]))
        return out

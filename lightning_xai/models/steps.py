"""Training, evaluation and prediction steps shared by the classifiers that implement the protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torchmetrics
from torch import Tensor, nn

from lightning_xai.adapters.protocol import Batch, ExplainOutput

__all__ = ["ClassifierSteps"]

if TYPE_CHECKING:  # the mixin's host is a LightningModule: type-check against it
    import pytorch_lightning as pl

    _Host = pl.LightningModule
else:
    _Host = object


class ClassifierSteps(_Host):
    """Mixin for a LightningModule classifier: cross-entropy plus ``objectives``, accuracy/F1, predictions.

    The host defines ``forward(batch) -> ExplainOutput``, ``objectives`` (an ``nn.ModuleList``),
    ``val_metrics``/``test_metrics`` and names the hyper-parameter holding the class count in
    ``num_classes_hparam``. Each objective is called ``objective(outputs, batch, model=self)``; its value is
    added to the loss and logged under ``train/<objective.name>``.
    """

    num_classes_hparam = "num_classes"
    objectives: nn.ModuleList
    val_metrics: torchmetrics.MetricCollection
    test_metrics: torchmetrics.MetricCollection

    def _labels(self, batch: Batch) -> Tensor:
        labels = batch["labels"]
        count = self.hparams[self.num_classes_hparam]
        if labels.numel() and (labels.min() < 0 or labels.max() >= count):
            raise ValueError(
                f"labels must lie in [0, {count}); got values {sorted(set(labels.tolist()))[:10]}. "
                f"Set {self.num_classes_hparam} to the number of classes."
            )
        return labels

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        outputs = self(batch)
        labels = self._labels(batch)
        size = labels.shape[0]
        loss = nn.functional.cross_entropy(outputs.logits, labels)
        self.log("train/ce", loss, batch_size=size)
        for objective in self.objectives:
            term = objective(outputs, batch, model=self)
            self.log(f"train/{getattr(objective, 'name', type(objective).__name__)}", term, batch_size=size)
            loss = loss + term
        self.log("train/loss", loss, prog_bar=True, batch_size=size)
        return loss

    def log_evaluation_extras(self, outputs: ExplainOutput, batch: Batch, stage: str, batch_size: int) -> None:
        """Hook for model-specific validation/test logs (nothing by default)."""

    def _evaluate(self, batch: Batch, metrics: torchmetrics.MetricCollection, stage: str) -> None:
        outputs = self(batch)
        labels = self._labels(batch)
        size = labels.shape[0]
        metrics.update(outputs.logits, labels)
        self.log(f"{stage}/loss", nn.functional.cross_entropy(outputs.logits, labels), batch_size=size, sync_dist=True)
        self.log_evaluation_extras(outputs, batch, stage, size)
        self.log_dict(metrics, prog_bar=stage == "val", batch_size=size)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics, "test")

    def predict_step(self, batch: Batch, batch_idx: int) -> Any:
        outputs = self(batch)
        return {"probs": outputs.logits.softmax(-1), "attention": outputs.attention}

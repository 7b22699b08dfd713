"""Wiegreffe & Pinter's diagnostic: a context-free MLP classifier pooled with attention from elsewhere.

(It lives with the models, not the audits: the diagnostic MLP is a model, and the audit layer must not import
the models.)

Each token is encoded alone (embedding → Linear(E, 128) → tanh, no context), then pooled with one of:
(a) the MLP's own trained attention, (b) uniform attention, (c) attention imposed (frozen) from the audited
model, (d) attention imposed from an adversary. If the audited model's attention marks tokens that matter
on their own, imposing it helps the context-free MLP more than uniform weights do, and more than an
adversary's attention that reproduces the predictions with different weights.
"""

from __future__ import annotations

import tempfile
import warnings
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import Tensor

from lightning_xai.adapters.protocol import Batch, ExplainableModel, ExplainOutput, as_explainable
from lightning_xai.models.classifier import AttentionClassifier

__all__ = ["DiagnosticMLP", "diagnostic_audit", "evaluate_classifier"]


class DiagnosticMLP(AttentionClassifier):
    """The diagnostic MLP as a LightningModule: ``AttentionClassifier(encoder="mlp")`` with an attention mode.

    Args:
        vocab_size: embedding rows.
        num_classes: classes.
        mode: ``"trained"`` (its own tanh attention), ``"uniform"`` (1/L) or ``"imposed"``.
        attention_source: for ``"imposed"``: the model whose attention (computed on the same batch, eval mode,
            no gradients) is used at train and test time. It is held outside this module's parameters and never
            updated.
        hidden_dim: MLP width (Wiegreffe & Pinter: 128).
        **kwargs: the other :class:`~lightning_xai.models.AttentionClassifier` arguments (embedding size, lr, ...).

    Example:
        >>> import torch
        >>> source = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> mlp = DiagnosticMLP(20, 2, mode="imposed", attention_source=source, embedding_dim=8, hidden_dim=16)
        >>> batch = {"input_ids": torch.tensor([[3, 4, 5]]), "mask": torch.ones(1, 3, dtype=torch.bool)}
        >>> torch.allclose(mlp(batch).attention, source(batch).attention)
        True
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int = 2,
        mode: str = "trained",
        attention_source: Optional[ExplainableModel] = None,
        hidden_dim: int = 128,
        **kwargs: Any,
    ) -> None:
        if mode not in ("trained", "uniform", "imposed"):
            raise ValueError(f"mode must be 'trained', 'uniform' or 'imposed', got {mode!r}.")
        if (mode == "imposed") != (attention_source is not None):
            raise ValueError(
                "Pass attention_source exactly when mode='imposed' (the model whose attention is imposed on the MLP)."
            )
        for key in ("encoder", "attention"):
            if key in kwargs:
                raise ValueError(f"DiagnosticMLP fixes {key!r}; do not pass it.")
        with warnings.catch_warnings():  # Lightning warns that the source module is an __init__ argument
            warnings.filterwarnings("ignore", message=".*attention_source.*")
            super().__init__(
                vocab_size,
                num_classes,
                encoder="mlp",
                attention="uniform" if mode == "uniform" else "tanh",
                hidden_dim=hidden_dim,
                **kwargs,
            )
        self.mode = mode
        # Lightning collects every __init__ argument as a hyperparameter; the source model is not one.
        for store in (self._hparams, getattr(self, "_hparams_initial", {})):
            store.pop("attention_source", None)
        self._source: Tuple[ExplainableModel, ...] = (
            (as_explainable(attention_source),) if attention_source is not None else ()
        )
        if attention_source is not None and isinstance(attention_source, torch.nn.Module):
            for p in attention_source.parameters():
                p.requires_grad_(False)

    def source_attention(self, batch: Batch) -> Tensor:
        """The imposed ``[B, T]`` attention of the source model on ``batch``."""
        source = self._source[0]
        if isinstance(source, torch.nn.Module):
            source.eval()
            first = next(source.parameters(), None)
            if first is not None and first.device != self.embedding.weight.device:
                source.to(self.embedding.weight.device)
        with torch.no_grad():
            return source.forward_from_embeddings(source.embed(batch), batch).attention.detach()

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        if attention_override is None and self._source:
            attention_override = self.source_attention(batch).to(embeddings.dtype)
        return super().forward_from_embeddings(embeddings, batch, attention_override=attention_override)


@torch.no_grad()
def evaluate_classifier(model: Any, batches: Iterable[Batch]) -> Dict[str, float]:
    """Accuracy and macro-F1 of ``model`` over ``batches`` (eval mode; the mode is restored).

    Example:
        >>> import torch
        >>> model = AttentionClassifier(vocab_size=20, num_classes=2, embedding_dim=8, hidden_dim=4)
        >>> batch = {"input_ids": torch.tensor([[3, 4]]), "mask": torch.ones(1, 2, dtype=torch.bool),
        ...          "labels": torch.tensor([0])}
        >>> sorted(evaluate_classifier(model, [batch]))
        ['acc', 'f1', 'n']
    """
    was_training = model.training
    model.eval()
    preds, labels = [], []
    try:
        for batch in batches:
            preds.append(model(batch).logits.argmax(-1).cpu())
            labels.append(batch["labels"].cpu())
    finally:
        model.train(was_training)
    pred, gold = torch.cat(preds), torch.cat(labels)
    classes = int(max(pred.max(), gold.max())) + 1
    f1s = []
    for c in range(classes):
        tp = int(((pred == c) & (gold == c)).sum())
        fp = int(((pred == c) & (gold != c)).sum())
        fn = int(((pred != c) & (gold == c)).sum())
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return {"acc": float((pred == gold).double().mean()), "f1": sum(f1s) / len(f1s), "n": float(len(gold))}


def diagnostic_audit(
    train_loader: Iterable[Batch],
    val_loader: Iterable[Batch],
    test_loader: Iterable[Batch],
    vocab_size: int,
    num_classes: int,
    sources: Optional[Mapping[str, ExplainableModel]] = None,
    *,
    include_trained: bool = True,
    include_uniform: bool = True,
    epochs: int = 5,
    seed: int = 0,
    trainer_kwargs: Optional[Dict[str, Any]] = None,
    **mlp_kwargs: Any,
) -> Dict[str, Dict[str, float]]:
    """Train one diagnostic MLP per attention setting and report test accuracy / macro-F1 for each.

    Settings: ``"trained"``, ``"uniform"`` and one ``"imposed:<name>"`` per entry of ``sources``. Each MLP
    starts from the same seed, trains ``epochs`` epochs with a real Trainer, and the epoch with the best
    validation accuracy is kept.

    Args:
        train_loader / val_loader / test_loader: batches of the task (same vocabulary as the sources).
        vocab_size / num_classes: of the task.
        sources: name → model whose attention is imposed (e.g. ``{"base": lstm, "adversary": adv}``).
        include_trained / include_uniform: also train settings (a) and (b).
        epochs: training epochs per MLP.
        seed: seed of every MLP.
        trainer_kwargs: extra ``pl.Trainer`` arguments (default: CPU, no logger; the best epoch is kept by a
            ``ModelCheckpoint`` on ``val/acc`` in a temporary folder).
        **mlp_kwargs: passed to :class:`DiagnosticMLP` (e.g. ``embedding_dim``, ``embedding_std``).

    Returns:
        setting → ``{"acc", "f1", "n", "val_acc"}``.
    """
    settings: Dict[str, Dict[str, Any]] = {}
    if include_trained:
        settings["trained"] = {"mode": "trained"}
    if include_uniform:
        settings["uniform"] = {"mode": "uniform"}
    for name, source in (sources or {}).items():
        settings[f"imposed:{name}"] = {"mode": "imposed", "attention_source": source}
    if not settings:
        raise ValueError("Nothing to audit: give sources or keep include_trained/include_uniform.")
    results: Dict[str, Dict[str, float]] = {}
    for setting, options in settings.items():
        pl.seed_everything(seed, verbose=False)
        model = DiagnosticMLP(vocab_size, num_classes, **options, **mlp_kwargs)
        with tempfile.TemporaryDirectory() as directory:
            # the best epoch's weights: Lightning's own checkpoint, in a folder that is gone afterwards
            best = ModelCheckpoint(
                dirpath=directory, monitor="val/acc", mode="max", save_top_k=1, save_weights_only=True
            )
            kwargs: Dict[str, Any] = dict(
                max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False
            )
            kwargs.update(trainer_kwargs or {})
            kwargs["enable_checkpointing"] = True
            kwargs["callbacks"] = list(kwargs.get("callbacks", [])) + [best]
            trainer = pl.Trainer(**kwargs)
            trainer.fit(model, train_loader, val_loader)
            if best.best_model_path:
                state = torch.load(best.best_model_path, map_location="cpu", weights_only=True)["state_dict"]
                model.load_state_dict(state)
        scores = evaluate_classifier(model, test_loader)
        scores["val_acc"] = float("-inf") if best.best_model_score is None else float(best.best_model_score)
        results[setting] = scores
    return results

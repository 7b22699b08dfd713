"""Issue 13: the diagnostic MLP lives in models (audits must not import models); the best epoch is kept by
Lightning's ModelCheckpoint. Oracle: a callback that snapshots the weights after every validation."""

import copy

import pytest
import pytorch_lightning as pl
from torch.utils.data import DataLoader, Subset

from lightning_xai.data import collate
from lightning_xai.models import DiagnosticMLP, diagnostic_audit, evaluate_classifier


class _Snapshots(pl.Callback):
    def __init__(self) -> None:
        self.epochs = []

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.epochs.append((float(trainer.callback_metrics["val/acc"]), copy.deepcopy(pl_module.state_dict())))


def test_the_first_best_validation_epoch_is_restored(sst2, tmp_path):
    train = DataLoader(Subset(sst2.dataset("train"), range(256)), batch_size=32, collate_fn=collate)
    val = DataLoader(Subset(sst2.dataset("val"), range(64)), batch_size=32, collate_fn=collate)
    test = DataLoader(Subset(sst2.dataset("val"), range(64, 160)), batch_size=32, collate_fn=collate)
    snapshots = _Snapshots()
    results = diagnostic_audit(
        train,
        val,
        test,
        sst2.vocab_size,
        2,
        include_uniform=False,
        epochs=5,
        seed=0,
        embedding_dim=16,
        hidden_dim=8,
        lr=0.1,
        trainer_kwargs={"default_root_dir": tmp_path, "callbacks": [snapshots]},
    )
    accuracies = [acc for acc, _ in snapshots.epochs]
    assert len(accuracies) == 5
    best = max(range(5), key=lambda epoch: (accuracies[epoch], -epoch))  # the first of the best
    assert best < 4 and accuracies[best] > accuracies[-1]  # the last epoch is not the one to keep here
    assert results["trained"]["val_acc"] == pytest.approx(accuracies[best])
    model = DiagnosticMLP(sst2.vocab_size, 2, embedding_dim=16, hidden_dim=8)
    model.load_state_dict(snapshots.epochs[best][1])
    assert results["trained"]["acc"] == evaluate_classifier(model, test)["acc"]
    assert not list(tmp_path.rglob("*.ckpt"))  # the checkpoint folder was temporary

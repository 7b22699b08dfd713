"""Restoring an earlier checkpoint in the same run (``trainer.test(ckpt_path=...)``) keeps the audits that ran
after it: restoring weights does not undo audits. A fresh callback (a resume) takes the checkpoint's history."""

from __future__ import annotations

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.data import TextClassificationDataModule
from lightning_xai.models import AttentionClassifier


class _Slice(TextClassificationDataModule):
    def examples(self, split):
        return super().examples(split)[: {"train": 64, "val": 16, "test": 16}[split]]


def test_testing_from_an_earlier_checkpoint_keeps_the_later_audits(tmp_path):
    dm = _Slice("sst2", batch_size=16, seed=0)
    dm.setup("fit")
    pl.seed_everything(0, verbose=False)
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=16, hidden_dim=8, vocab=dm.vocab.itos)
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=8, every_n_epochs=1)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", filename="{epoch}", save_top_k=-1)
    trainer = pl.Trainer(
        max_epochs=3,
        callbacks=[audit, checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    assert [r["epoch"] for r in audit.history] == [0, 1, 2]
    trainer.test(model, datamodule=dm, ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"), verbose=False)
    assert [(r["stage"], r["epoch"]) for r in audit.history][:3] == [("fit", 0), ("fit", 1), ("fit", 2)]
    assert audit.history[-1]["stage"] == "test" and len(audit.history) == 4

    fresh = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=8, every_n_epochs=1)
    fresh.load_state_dict(audit.state_dict() | {"history": audit.history[:1]})
    assert [r["epoch"] for r in fresh.history] == [0]

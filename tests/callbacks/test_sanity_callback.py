"""SanityCheck callback: runs the saliency sanity checks at the end of a real fit and logs them."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.callbacks.sanity import SanityCheck
from lightning_xai.data import collate
from lightning_xai.models import AttentionClassifier


def _loaders(sst2):
    train = torch.utils.data.Subset(sst2.dataset("train"), range(64))
    val = torch.utils.data.Subset(sst2.dataset("val"), range(24))
    make = lambda ds: torch.utils.data.DataLoader(ds, batch_size=16, collate_fn=collate)  # noqa: E731
    return make(train), make(val)


def test_sanity_check_runs_at_fit_end_and_logs(sst2, tmp_path):
    pl.seed_everything(0, verbose=False)
    model = AttentionClassifier(sst2.vocab_size, embedding_dim=16, hidden_dim=8, embedding_std=0.3)
    callback = SanityCheck(
        invariance_methods=["gradient", "grad_x_input"],
        randomization_methods=["gradient"],
        ig_steps=(8,),
        num_samples=12,
        batch_size=6,
    )
    trainer = pl.Trainer(
        max_epochs=1,
        default_root_dir=tmp_path,
        logger=CSVLogger(tmp_path),
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    train, val = _loaders(sst2)
    trainer.fit(model, train, val)
    assert len(callback.history) == 1 and callback.history[0]["stage"] == "fit"
    metrics = callback.history[0]["metrics"]
    assert metrics["input_invariance/gradient/passes/mean"] == 1.0
    assert metrics["input_invariance/grad_x_input/passes/mean"] < 0.5
    assert "model_randomization/cascading/embedding/gradient/tau/mean" in metrics
    assert metrics["completeness/integrated_gradients_8_steps/relative_error/mean"] < 0.05
    assert len(callback.tables) == 2 and set(callback.tables[0]) == {
        "input_invariance",
        "model_randomization",
        "completeness",
    }
    logged = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text()
    assert "sanity/input_invariance/gradient/passes/mean" in logged
    # validation alone does not trigger it (only the explicit on_validate does)
    trainer.validate(model, val, verbose=False)
    assert len(callback.history) == 1


def test_sanity_check_config_errors():
    with pytest.raises(MisconfigurationException, match="checks"):
        SanityCheck(checks=["smell"])
    with pytest.raises(MisconfigurationException, match="randomization_mode"):
        SanityCheck(randomization_mode="all")
    with pytest.raises(MisconfigurationException, match="ig_steps"):
        SanityCheck(ig_steps=(0,))
    with pytest.raises(MisconfigurationException, match="never run"):
        SanityCheck(at_fit_end=False)

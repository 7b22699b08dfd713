"""Issue 30: an adapter whose logits are not its model's is refused by every audit callback before its first audit.

A right-padded Llama classifier audited with ``query_index=-1`` reads a pad position for the shorter rows: before,
the callbacks never compared the adapter with the model (only ``adapter.forward`` did, which they do not call) and
logged numbers for another function (τ 0.0019 in the issue). Every callback now runs
:func:`~lightning_xai.adapters.checks.check_logits` in its two-example probe.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_xai.callbacks import (
    AdversarialSearchAudit,
    AttentionAudit,
    AttentionBaselines,
    ErasureAudit,
    ImpermissibleAttentionMonitor,
    SanityCheck,
)
from tests.adapters.test_families import family_batch, family_model


class _UserModule(pl.LightningModule):
    """A user's module holding a right-padded Llama classifier, unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.net = family_model("llama").float()

    def training_step(self, batch, batch_idx):
        return self.net(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).loss

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader():
    batch = family_batch("llama", left=False)
    batch["impermissible"] = torch.zeros_like(batch["mask"])
    rows = [{k: v[i] for k, v in batch.items()} for i in range(3)] * 2
    return DataLoader(rows, batch_size=3)


CALLBACKS = {
    "AttentionAudit": lambda spec: AttentionAudit(model=spec, methods=("gradient",), budget=None, num_samples=6),
    "ErasureAudit": lambda spec: ErasureAudit(model=spec, budget=None, num_samples=6),
    "AttentionBaselines": lambda spec: AttentionBaselines(model=spec, budget=None, num_samples=6, num_permutations=2),
    "AdversarialSearchAudit": lambda spec: AdversarialSearchAudit(model=spec, budget=None, num_samples=6),
    "ImpermissibleAttentionMonitor": lambda spec: ImpermissibleAttentionMonitor(model=spec, budget=None, num_samples=6),
    "SanityCheck": lambda spec: SanityCheck(model=spec, budget=None, num_samples=6),
}


def _fit(callback, tmp_path):
    module = _UserModule()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = pl.Trainer(
        max_epochs=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        accelerator="cpu",
    )
    trainer.fit(module, _loader(), _loader())
    return before, module.state_dict()


@pytest.mark.parametrize("name", sorted(CALLBACKS))
def test_every_callback_refuses_an_adapter_whose_logits_are_not_the_models(name, tmp_path):
    wrong = CALLBACKS[name]({"model": "net", "query_index": -1})  # a pad position on the right-padded rows
    with pytest.raises(MisconfigurationException, match=r"logits differ from LlamaForSequenceClassification's own"):
        _fit(wrong, tmp_path)


@pytest.mark.parametrize("name", ["AttentionAudit", "ErasureAudit"])
def test_the_same_callbacks_audit_the_model_found_with_no_options(name, tmp_path):
    right = CALLBACKS[name]("net")  # the last real token per row, found from the model's behaviour
    before, after = _fit(right, tmp_path)
    assert len(right.history) == 1
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained

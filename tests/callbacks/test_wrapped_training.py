"""Issue 30: a PEFT (LoRA) classifier trained in a Trainer as users train it — with gradient checkpointing and
``torch.compile`` — audited by ``AttentionAudit()`` and ``ErasureAudit()`` and trained with ``DeceptionPenalty``,
with no adapter options anywhere.

Oracles: the weights of the same run without the callbacks (bit-identical: the audits are non-invasive), and the
audits of the trained model's ``merge_and_unload()`` twin (the same function without PEFT), whose logged values
must equal the wrapped model's to 1e-5.
"""

from __future__ import annotations

import copy
import math

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from lightning_xai.adapters import explainable_model
from lightning_xai.callbacks import AttentionAudit, ErasureAudit
from lightning_xai.losses import DeceptionPenalty
from tests.adapters.test_families import family_batch, family_model

peft = pytest.importorskip("peft")
from peft import LoraConfig, get_peft_model  # noqa: E402

TARGETS = {"bert": ["query", "value"], "llama": ["q_proj", "v_proj"]}


class _LoraClassifier(pl.LightningModule):
    """A user's module: a LoRA classifier trained on its own loss plus Pruthi's penalty, found with no options."""

    def __init__(self, family: str, checkpointing: bool, compiled: bool) -> None:
        super().__init__()
        # float32: float64 Llama gives NaN logits on left padding in its own forward; train mode (no dropout in
        # these configs): the layers run checkpointed
        model = family_model(family).float().train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        torch.manual_seed(3)
        config = LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8, target_modules=TARGETS[family])
        net = get_peft_model(model, config)
        self.net = torch.compile(net, backend="eager") if compiled else net
        self.penalty = DeceptionPenalty(weight=0.1)

    def training_step(self, batch, batch_idx):
        loss = self.net(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        outputs = explainable_model(self)(batch)  # the one line a LoRA run adds for the penalty
        return loss.loss + self.penalty(outputs, batch, model=self)

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.5)


class _Merged(pl.LightningModule):
    """The trained model's ``merge_and_unload()`` twin, audited the same way."""

    def __init__(self, merged: torch.nn.Module) -> None:
        super().__init__()
        self.net = merged

    def validation_step(self, batch, batch_idx):
        pass


def _loader(family: str, left: bool) -> DataLoader:
    batch = family_batch(family, left)
    impermissible = torch.zeros_like(batch["mask"])
    impermissible[torch.arange(3), batch["mask"].long().argmax(1)] = True  # each row's first real token
    batch["impermissible"] = impermissible
    rows = [{k: v[i] for k, v in batch.items()} for i in range(3)] * 2
    return DataLoader(rows, batch_size=3)


def _audits(**options):
    return [AttentionAudit(budget=None, num_samples=6, **options), ErasureAudit(budget=None, num_samples=6, **options)]


CASES = [("bert", False), ("llama", False), ("llama", True)]
WRAPPINGS = [(False, False), (True, True)]


@pytest.mark.parametrize("checkpointing,compiled", WRAPPINGS, ids=["lora", "lora-checkpointing-compiled"])
@pytest.mark.parametrize("family,left", CASES, ids=["bert-right", "llama-right", "llama-left"])
def test_a_lora_run_is_audited_with_one_line_as_its_merged_model_and_trains_bit_identically(
    family, left, checkpointing, compiled, kit, tmp_path
):
    audited = _LoraClassifier(family, checkpointing, compiled)
    callbacks = _audits()
    kit.make_trainer(tmp_path / "audited", callbacks, max_epochs=2).fit(
        audited, _loader(family, left), _loader(family, left)
    )
    plain = _LoraClassifier(family, checkpointing, compiled)
    kit.make_trainer(tmp_path / "plain", max_epochs=2).fit(plain, _loader(family, left), _loader(family, left))

    weights, reference = audited.state_dict(), plain.state_dict()
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[k], reference[k]) for k in weights)  # the audits are non-invasive
    start = _LoraClassifier(family, checkpointing, compiled).state_dict()
    assert any(not torch.equal(weights[k], start[k]) for k in weights)  # the LoRA weights trained
    assert audited.penalty.seen_examples > 0 and float(audited.penalty.last_mass) > 0

    assert [len(c.history) for c in callbacks] == [2, 2]  # both epochs audited
    peft_model = getattr(audited.net, "_orig_mod", audited.net)
    merged = _Merged(copy.deepcopy(peft_model).merge_and_unload().eval())
    twins = _audits(on_validate=True)
    kit.make_trainer(tmp_path / "merged", twins).validate(merged, _loader(family, left))
    for wrapped, twin in zip(callbacks, twins):
        ours, theirs = wrapped.history[-1]["metrics"], twin.history[-1]["metrics"]
        assert ours.keys() == theirs.keys() and ours
        for key, value in ours.items():
            assert math.isclose(value, theirs[key], abs_tol=1e-5) or (math.isnan(value) and math.isnan(theirs[key])), (
                key,
                value,
                theirs[key],
            )

"""ModelConsistentAdversary: the base is never updated; the terms match scipy; training moves attention."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy
from torch.utils.data import DataLoader, Subset

from lightning_xai.data import collate
from lightning_xai.losses import ModelConsistentAdversary
from lightning_xai.models import AttentionClassifier


def test_terms_match_scipy(trained_model, sst2_batch):
    base = copy.deepcopy(trained_model)  # the objective freezes its base; keep the shared fixture intact
    adversary = copy.deepcopy(trained_model)
    torch.nn.init.normal_(adversary.attention.v.weight, std=1.0)
    objective = ModelConsistentAdversary(base, weight=0.5)
    out = adversary(sst2_batch)
    loss = objective(out, sst2_batch)
    base = base(sst2_batch)
    p, q = out.attention.detach().numpy(), base.attention.detach().numpy()
    kl = np.mean([entropy(p[i][p[i] > 0], q[i][p[i] > 0]) for i in range(len(p))])
    jsd = np.mean([jensenshannon(p[i], q[i]) ** 2 for i in range(len(p))])
    tvd = np.mean(
        0.5 * np.abs(out.logits.softmax(-1).detach().numpy() - base.logits.softmax(-1).detach().numpy()).sum(-1)
    )
    assert objective.last_terms["kl"].item() == pytest.approx(kl, rel=1e-4)
    assert objective.last_terms["jsd"].item() == pytest.approx(jsd, rel=1e-4)
    assert objective.last_terms["tvd"].item() == pytest.approx(tvd, rel=1e-4, abs=1e-7)
    assert loss.item() == pytest.approx(tvd - 0.5 * kl, rel=1e-4, abs=1e-6)


class _AdversaryModule(AttentionClassifier):
    """A user's adversary: the adversarial objective only, no cross-entropy on gold labels."""

    def training_step(self, batch, batch_idx):
        outputs = self(batch)
        loss = self.objectives[0](outputs, batch, model=self)
        self.log("train/loss", loss, batch_size=outputs.logits.shape[0])
        return loss


def test_trainer_never_updates_the_base(sst2, trained_model, tmp_path):
    base = copy.deepcopy(trained_model).train()  # even a base left in train mode is evaluated frozen
    base.zero_grad(set_to_none=True)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    objective = ModelConsistentAdversary(base, weight=1.0)
    adversary = _AdversaryModule(sst2.vocab_size, 2, embedding_dim=32, hidden_dim=16, objectives=[objective])
    adversary.load_state_dict(base.state_dict(), strict=False)
    torch.nn.init.normal_(adversary.attention.v.weight, std=1.0)
    start = {k: v.clone() for k, v in adversary.state_dict().items()}
    assert all(id(p) not in {id(q) for q in base.parameters()} for p in adversary.parameters())
    loader = DataLoader(Subset(sst2.dataset("train"), range(96)), batch_size=32, collate_fn=collate)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(adversary, loader)
    optimised = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert not optimised & {id(p) for p in base.parameters()}
    assert all(torch.equal(before[k], v) for k, v in base.state_dict().items())
    assert not base.training and all(p.grad is None and not p.requires_grad for p in base.parameters())
    assert not any(torch.equal(start[k], v) for k, v in adversary.state_dict().items() if k.startswith("attention"))
    assert {"train/adversary_kl", "train/adversary_jsd", "train/adversary_tvd"} <= set(trainer.logged_metrics)
    assert not any(k.startswith("objectives.") for k in adversary.state_dict())


def test_rejects_non_explainable_base_and_negative_lambda(trained_model):
    with pytest.raises(TypeError, match="ExplainableModel"):
        ModelConsistentAdversary(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="weight"):
        ModelConsistentAdversary(copy.deepcopy(trained_model), weight=-1.0)

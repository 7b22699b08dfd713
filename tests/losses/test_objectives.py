"""Every loss as an objective of a real Trainer run (each term logged), in a user's own module, and conicity."""

from __future__ import annotations

import copy

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Subset

from lightning_xai.adapters import ExplainOutput
from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.losses import (
    AttentionAlignmentLoss,
    ConicityLoss,
    DeceptionPenalty,
    ErasureFaithfulnessLoss,
    conicity,
    normalize_saliency,
)
from lightning_xai.models import AttentionClassifier


@pytest.fixture(scope="module")
def wiki():
    dm = TextClassificationDataModule("sst_wiki", batch_size=16)
    dm.setup("fit")
    return dm


def _trainer(tmp_path, steps):
    return pl.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        log_every_n_steps=1,
    )


def test_trainer_logs_each_objective(wiki, tmp_path):
    torch.manual_seed(0)
    objectives = [
        DeceptionPenalty(weight=0.1),
        ConicityLoss(weight=0.5),
        ErasureFaithfulnessLoss(fraction=0.2),
        AttentionAlignmentLoss("gradient", weight=0.1),
    ]
    model = AttentionClassifier(
        wiki.vocab_size, 2, embedding_dim=16, hidden_dim=8, attention="linear", objectives=objectives
    )
    loader = DataLoader(Subset(wiki.dataset("train"), range(48)), batch_size=16, collate_fn=collate)
    trainer = _trainer(tmp_path, 3)
    trainer.fit(model, loader)
    logged = set(trainer.logged_metrics)
    expected = {
        "train/ce",
        "train/loss",
        "train/deception",
        "train/conicity",
        "train/erasure",
        "train/alignment",
        "train/deception_mass",
        "train/deception_empty",
        "train/erasure_comprehensiveness",
        "train/erasure_sufficiency",
    }
    assert expected <= logged, expected - logged
    parts = sum(
        float(trainer.logged_metrics[f"train/{k}"]) for k in ("ce", "deception", "conicity", "erasure", "alignment")
    )
    assert float(trainer.logged_metrics["train/loss"]) == pytest.approx(parts, rel=1e-4, abs=1e-5)
    assert objectives[0].seen_examples == 48


class UserModule(pl.LightningModule):
    """A user's own LightningModule: the penalty is one line in training_step."""

    def __init__(self, vocab_size):
        super().__init__()
        self.net = AttentionClassifier(vocab_size, 2, embedding_dim=16, hidden_dim=8, attention="linear")
        self.penalty = DeceptionPenalty(weight=1.0)

    def training_step(self, batch, batch_idx):
        outputs = self.net(batch)
        ce = torch.nn.functional.cross_entropy(outputs.logits, batch["labels"])
        loss = ce + self.penalty(outputs, batch)
        self.log("train/loss", loss, batch_size=len(batch["labels"]))
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_penalty_in_a_users_own_module_lowers_impermissible_mass(wiki, tmp_path):
    torch.manual_seed(0)
    module = UserModule(wiki.vocab_size)
    batch = collate([wiki.dataset("train")[i] for i in range(16)])
    with torch.no_grad():
        before = (module.net(batch).attention * batch["impermissible"]).sum(-1).mean()
    trainer = _trainer(tmp_path, 20)
    trainer.fit(module, DataLoader([batch], batch_size=None))
    with torch.no_grad():
        after = (module.net(batch).attention * batch["impermissible"]).sum(-1).mean()
    assert after < 0.5 * before
    assert module.penalty.seen_examples == 20 * 16


def test_conicity_of_known_geometry():
    hidden = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [0.0, 5.0]]])
    assert conicity(hidden, torch.tensor([[True, True, False]])).item() == pytest.approx(1.0)
    h = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]])
    # four orthogonal/opposite vectors: mean is 0, conicity 0 (cos undefined -> 0 by the eps clamp)
    assert conicity(h, torch.ones(1, 4, dtype=torch.bool)).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="hidden_states"):
        ConicityLoss()(ExplainOutput(logits=torch.zeros(1, 2), attention=torch.ones(1, 2)), {"mask": torch.ones(1, 2)})


def test_erasure_and_alignment_need_the_model_and_valid_options():
    out = ExplainOutput(logits=torch.zeros(1, 2), attention=torch.full((1, 2), 0.5))
    with pytest.raises(ValueError, match="model=self"):
        ErasureFaithfulnessLoss()(out, {"mask": torch.ones(1, 2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="model=self"):
        AttentionAlignmentLoss()(out, {"mask": torch.ones(1, 2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="fraction"):
        ErasureFaithfulnessLoss(fraction=1.5)
    with pytest.raises(ValueError, match="mode"):
        ErasureFaithfulnessLoss(mode="tokens")
    with pytest.raises(ValueError, match="direction"):
        AttentionAlignmentLoss(direction="both")
    uniform = normalize_saliency(torch.zeros(1, 3), torch.tensor([[True, True, False]]))
    assert torch.allclose(uniform, torch.tensor([[0.5, 0.5, 0.0]]))


def test_alignment_gradients_flow_where_documented(trained_model, sst2_batch):
    model = copy.deepcopy(trained_model).train()
    for create_graph in (False, True):
        model.zero_grad(set_to_none=True)
        loss = AttentionAlignmentLoss("gradient", create_graph=create_graph)(model(sst2_batch), sst2_batch, model=model)
        loss.backward()
        # the classifier head only influences the loss through the saliency map (attention does not depend on it)
        head = model.classifier.weight.grad
        assert model.attention.v.weight.grad.abs().sum() > 0
        if create_graph:
            assert head is not None and head.abs().sum() > 0
        else:
            assert head is None or head.abs().sum() == 0

"""RationaleSupervisionLoss: values against a numpy/scipy reference, its gradient moves attention onto the human
rationale of real ERASER movie reviews, it trains as an objective of a real Trainer run, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from scipy.stats import entropy
from torch.utils.data import DataLoader, Subset

from lightning_xai.adapters import ExplainOutput
from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.losses.rationale import RationaleSupervisionLoss, rationale_supervision
from lightning_xai.models import AttentionClassifier


@pytest.fixture(scope="module")
def movies():
    dm = TextClassificationDataModule("eraser_movies", batch_size=8, max_length=80)
    with pytest.warns(UserWarning, match="truncated"):
        dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def movie_batch(movies):
    dataset = movies.dataset("train")
    items = [dataset[i] for i in range(40)]
    items = [item for item in items if any(item["rationale"])][:8]
    assert len(items) == 8
    return collate(items)


def test_values_match_scipy(movie_batch):
    torch.manual_seed(0)
    mask, rationale = movie_batch["mask"], movie_batch["rationale"]
    attention = torch.rand(mask.shape, dtype=torch.float64).masked_fill(~mask, 0)
    attention = attention / attention.sum(1, keepdim=True)
    kl = rationale_supervision(attention, rationale, mask, "kl")
    ce = rationale_supervision(attention, rationale, mask, "cross_entropy")
    mass = rationale_supervision(attention, rationale, mask, "mass")
    for b in range(8):
        r = (rationale[b] & mask[b]).double().numpy()
        r /= r.sum()
        a = attention[b].numpy()
        assert kl[b].item() == pytest.approx(entropy(r, a), rel=1e-6)
        assert ce[b].item() == pytest.approx(-(r[r > 0] * np.log(a[r > 0])).sum(), rel=1e-6)
        assert mass[b].item() == pytest.approx(-np.log(a[r > 0].sum()), rel=1e-6)


def test_gradient_moves_attention_toward_the_rationale(movies, movie_batch):
    torch.manual_seed(0)
    model = AttentionClassifier(movies.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3)
    rationale, mask = movie_batch["rationale"], movie_batch["mask"]

    def mass():
        with torch.no_grad():
            return float((model(movie_batch).attention * rationale).sum(1).mean())

    share = float((rationale & mask).sum() / mask.sum())
    before = mass()
    assert before == pytest.approx(share, abs=0.1)  # an untrained scorer is near uniform
    for kind in ("kl", "mass"):
        loss_fn = RationaleSupervisionLoss(weight=1.0, kind=kind)
        start = mass()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(30):
            optimizer.zero_grad()
            loss = loss_fn(model(movie_batch), movie_batch, model=model)
            loss.backward()
            optimizer.step()
        assert mass() > start + 0.05, (kind, start, mass())
    assert mass() > 2 * before
    # only the attention side is trained: the classifier head never gets a gradient from this loss
    model.zero_grad()
    RationaleSupervisionLoss()(model(movie_batch), movie_batch, model=model).backward()
    assert model.classifier.weight.grad is None or model.classifier.weight.grad.abs().sum() == 0
    assert model.attention.parameters().__next__().grad.abs().sum() > 0


def test_trains_as_an_objective(movies, tmp_path):
    torch.manual_seed(0)
    objective = RationaleSupervisionLoss(weight=0.5)
    model = AttentionClassifier(movies.vocab_size, 2, embedding_dim=16, hidden_dim=8, objectives=[objective])
    loader = DataLoader(Subset(movies.dataset("train"), range(24)), batch_size=8, collate_fn=collate)
    trainer = pl.Trainer(
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        log_every_n_steps=1,
    )
    trainer.fit(model, loader)
    assert {"train/rationale", "train/rationale_mass", "train/rationale_empty"} <= set(trainer.logged_metrics)
    assert objective.seen_examples == 24


def test_empty_rationales_contribute_nothing():
    attention = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    batch = {"rationale": torch.tensor([[False, False], [False, True]]), "mask": torch.ones(2, 2, dtype=torch.bool)}
    loss = RationaleSupervisionLoss()
    value = loss(ExplainOutput(logits=torch.zeros(2, 2), attention=attention), batch)
    assert value.item() == pytest.approx(-np.log(0.1), rel=1e-6)  # the mean over the one example with a rationale
    assert loss.empty_examples == 1 and loss.seen_examples == 2


def test_clear_errors():
    out = ExplainOutput(logits=torch.zeros(1, 2), attention=torch.full((1, 2), 0.5))
    with pytest.raises(KeyError, match="eraser_movies"):
        RationaleSupervisionLoss()(out, {"mask": torch.ones(1, 2, dtype=torch.bool)})
    with pytest.raises(TypeError, match="bool"):
        RationaleSupervisionLoss(key="r")(out, {"r": torch.ones(1, 2), "mask": torch.ones(1, 2, dtype=torch.bool)})
    with pytest.raises(ValueError, match="kind"):
        RationaleSupervisionLoss(kind="l2")
    with pytest.raises(ValueError, match="weight"):
        RationaleSupervisionLoss(weight=-1)

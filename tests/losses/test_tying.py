"""WordTyingLoss (Tutek & Šnajder 2020): both forms against hand formulas on real SST-2 sentences, training with it
ties the hidden states to their words (the loss falls and the tied decoder recovers the words), the projection is
trained by the model's own optimizer under a Trainer, and clear errors."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Subset

from lightning_xai.adapters import ExplainOutput
from lightning_xai.data import collate
from lightning_xai.losses.tying import WordTyingLoss
from lightning_xai.models import AttentionClassifier


def _model(sst2, **kwargs):
    torch.manual_seed(0)
    return AttentionClassifier(sst2.vocab_size, 2, embedding_dim=16, hidden_dim=8, embedding_std=0.3, **kwargs)


def test_embedding_form_matches_hand_formula(sst2, sst2_batch):
    model = _model(sst2)
    loss = WordTyingLoss(hidden_dim=16, embedding_dim=16, weight=0.5)
    out = model(sst2_batch)
    value = loss(out, sst2_batch, model=model)
    mask = sst2_batch["mask"]
    errors, norms = [], []
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                e = model.embedding.weight[sst2_batch["input_ids"][b, t]].detach()
                p = loss.projection(out.hidden_states[b, t])
                errors.append(((p - e) ** 2).sum())
                norms.append((e**2).sum())
    torch.testing.assert_close(value, 0.5 * torch.stack(errors).sum() / torch.stack(norms).sum())


def test_word_form_matches_hand_formula(sst2, sst2_batch):
    model = _model(sst2)
    loss = WordTyingLoss(hidden_dim=16, embedding_dim=16, mode="word")
    out = model(sst2_batch)
    mask = sst2_batch["mask"]
    nll = []
    for b, t in mask.nonzero().tolist():
        logits = model.embedding.weight @ loss.projection(out.hidden_states[b, t])
        nll.append(-logits.log_softmax(-1)[sst2_batch["input_ids"][b, t]])
    torch.testing.assert_close(loss(out, sst2_batch, model=model), torch.stack(nll).mean())


@pytest.mark.parametrize("mode", ["embedding", "word"])
def test_training_ties_hidden_states_to_words(sst2, mode):
    model = _model(sst2)
    loss = WordTyingLoss(hidden_dim=16, embedding_dim=16, mode=mode)
    batch = collate([sst2.dataset("train")[i] for i in range(64)])
    params = list(model.parameters()) + list(loss.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-2)

    def value():
        with torch.no_grad():
            return float(loss(model(batch), batch, model=model))

    def word_accuracy():
        with torch.no_grad():
            out = model(batch)
            mask = batch["mask"]
            guess = (loss.projection(out.hidden_states[mask]) @ model.embedding.weight.t()).argmax(-1)
            return float((guess == batch["input_ids"][mask]).double().mean())

    before, accuracy_before = value(), word_accuracy()
    for _ in range(40):
        optimizer.zero_grad()
        (loss(model(batch), batch, model=model)).backward()
        optimizer.step()
    after = value()
    assert after < 0.6 * before, (before, after)
    if mode == "word":  # the tied decoder now reads many words back from their own hidden state
        accuracy = word_accuracy()
        assert accuracy > 0.2 and accuracy > 10 * accuracy_before, (accuracy_before, accuracy)


def test_projection_is_trained_as_an_objective(sst2, tmp_path):
    tie = WordTyingLoss(hidden_dim=16, embedding_dim=16, weight=1.0)
    model = _model(sst2, objectives=[tie])
    start = tie.projection.weight.detach().clone()
    loader = DataLoader(Subset(sst2.dataset("train"), range(48)), batch_size=16, collate_fn=collate)
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
    assert "train/tying" in trainer.logged_metrics
    assert not torch.equal(start, tie.projection.weight.detach())


def test_clear_errors(sst2, sst2_batch):
    model = _model(sst2)
    out = model(sst2_batch)
    with pytest.raises(ValueError, match="2·hidden_dim"):
        WordTyingLoss(hidden_dim=8, embedding_dim=16)(out, sst2_batch, model=model)
    with pytest.raises(ValueError, match="embedding_dim"):
        WordTyingLoss(hidden_dim=16, embedding_dim=4, mode="word")(out, sst2_batch, model=model)
    with pytest.raises(ValueError, match="needs the model"):
        WordTyingLoss(hidden_dim=16, embedding_dim=16)(out, sst2_batch)
    bare = ExplainOutput(logits=out.logits, attention=out.attention)
    with pytest.raises(ValueError, match="hidden_states"):
        WordTyingLoss(hidden_dim=16, embedding_dim=16)(bare, sst2_batch, model=model)
    with pytest.raises(ValueError, match="mode"):
        WordTyingLoss(hidden_dim=16, embedding_dim=16, mode="mlm")

"""The reference model: attention is a distribution over real tokens, overrides act as hand computations say."""

from __future__ import annotations

import itertools

import pytest
import pytorch_lightning as pl
import torch

from lightning_xai.adapters import ExplainableModel, ProtocolError, as_explainable
from lightning_xai.data import collate
from lightning_xai.models import ATTENTIONS, ENCODERS, AttentionClassifier

COMBINATIONS = list(itertools.product(sorted(ENCODERS), sorted(ATTENTIONS)))


def small_model(vocab_size: int, encoder: str = "bilstm", attention: str = "tanh") -> AttentionClassifier:
    torch.manual_seed(0)
    return AttentionClassifier(
        vocab_size, 2, encoder=encoder, attention=attention, embedding_dim=12, hidden_dim=6, embedding_std=0.5
    ).eval()


@pytest.fixture(scope="module")
def ragged_batch(sst2):
    """Real SST-2 sentences: one of length 1 and others from very short to the longest in dev."""
    dataset = sst2.dataset("val")
    lengths = [len(e.tokens) for e in sst2.examples("val")]
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    items = [dataset[i] for i in (longest, 0, 1, 2)]
    single = dict(dataset[3])
    single.update(input_ids=single["input_ids"][:1], mask=single["mask"][:1])
    return collate(items + [single])


@pytest.mark.parametrize("encoder,attention", COMBINATIONS)
def test_attention_is_a_distribution_over_real_tokens(sst2, ragged_batch, encoder, attention):
    model = small_model(sst2.vocab_size, encoder, attention)
    with torch.no_grad():
        out = model(ragged_batch)
    mask = ragged_batch["mask"]
    assert mask.sum(1).tolist()[-1] == 1 and mask.sum(1).max() > 40
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(mask.shape[0]))
    assert (out.attention[~mask] == 0).all() and (out.attention[mask] > 0).all()
    assert out.attention[-1, 0] == 1.0  # a length-1 row attends to its only token
    assert out.logits.shape == (mask.shape[0], 2)


@pytest.mark.parametrize("encoder,attention", COMBINATIONS)
def test_uniform_override_is_mean_pooling(sst2, ragged_batch, encoder, attention):
    model = small_model(sst2.vocab_size, encoder, attention)
    mask = ragged_batch["mask"]
    uniform = mask.float() / mask.sum(1, keepdim=True)
    with torch.no_grad():
        out = model(ragged_batch, attention_override=uniform)
        hidden = model.encoder(model.embed(ragged_batch), mask)
        pooled = torch.stack([hidden[b, mask[b]].mean(0) for b in range(mask.shape[0])])
        expected = model.classifier(pooled)
    torch.testing.assert_close(out.logits, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_own_attention_as_override_reproduces_logits(sst2, ragged_batch, encoder):
    model = small_model(sst2.vocab_size, encoder)
    with torch.no_grad():
        out = model(ragged_batch)
        again = model(ragged_batch, attention_override=out.attention)
    assert torch.equal(out.logits, again.logits)


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_pad_contents_do_not_matter(sst2, ragged_batch, encoder):
    model = small_model(sst2.vocab_size, encoder)
    noisy = dict(ragged_batch)
    ids = ragged_batch["input_ids"].clone()
    ids[~ragged_batch["mask"]] = 7
    noisy["input_ids"] = ids
    with torch.no_grad():
        torch.testing.assert_close(model(noisy).logits, model(ragged_batch).logits, rtol=1e-5, atol=1e-6)


def test_sos_eos_are_encoded_but_not_attended(sst2):
    from lightning_xai.data import TextClassificationDataModule

    dm = TextClassificationDataModule("sst2", add_sos_eos=True, batch_size=4)
    batch = next(iter(dm.val_dataloader()))
    model = small_model(dm.vocab_size)
    with torch.no_grad():
        out = model(batch)
    assert (out.attention[:, 0] == 0).all()
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(4))


def test_protocol_and_errors(sst2, sst2_batch):
    model = small_model(sst2.vocab_size)
    assert isinstance(model, ExplainableModel) and as_explainable(model) is model
    with pytest.raises(ProtocolError, match="HuggingFaceAdapter"):
        as_explainable(torch.nn.LSTM(2, 2))
    bad = dict(sst2_batch, mask=sst2_batch["mask"][:, :-1])
    with pytest.raises(ValueError, match="'mask' has shape"):
        model(bad)
    empty = dict(sst2_batch, mask=sst2_batch["mask"].clone())
    empty["mask"][2] = False
    with pytest.raises(ValueError, match=r"rows \[2\] have no real token"):
        model(empty)
    with pytest.raises(ValueError, match="attention_override has shape"):
        model(sst2_batch, attention_override=torch.ones(3, 3))
    with pytest.raises(ValueError, match="Unknown encoder 'gru'"):
        AttentionClassifier(10, 2, encoder="gru")
    with pytest.raises(ValueError, match="Unknown attention 'soft'"):
        AttentionClassifier(10, 2, attention="soft")


def test_attention_parameters_are_not_weight_decayed():
    model = AttentionClassifier(20, 2, embedding_dim=8, hidden_dim=4)
    optimizer = model.configure_optimizers()
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert all(decay[id(p)] == 0.0 for p in model.attention.parameters())
    assert decay[id(model.embedding.weight)] == 1e-5
    assert optimizer.defaults["amsgrad"] and optimizer.defaults["lr"] == 1e-3


def test_trains_on_real_data(sst2, tmp_path):
    model = AttentionClassifier(sst2.vocab_size, 2, embedding_dim=16, hidden_dim=8)
    before = model.classifier.weight.detach().clone()
    trainer = pl.Trainer(
        fast_dev_run=2, logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path
    )
    trainer.fit(model, sst2)
    assert not torch.equal(before, model.classifier.weight)
    assert {"train/loss", "val/acc", "val/f1"} <= set(trainer.callback_metrics)


class Penalty(torch.nn.Module):
    name = "entropy"

    def forward(self, outputs, batch, model=None):
        attention = outputs.attention.clamp_min(1e-12)
        return -(attention * attention.log()).sum(-1).mean() * 0.01


def test_objectives_are_added_and_logged(sst2, tmp_path):
    model = AttentionClassifier(sst2.vocab_size, 2, embedding_dim=16, hidden_dim=8, objectives=[Penalty()])
    trainer = pl.Trainer(
        fast_dev_run=1, logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path
    )
    trainer.fit(model, sst2)
    metrics = trainer.callback_metrics
    torch.testing.assert_close(metrics["train/loss"], metrics["train/ce"] + metrics["train/entropy"])

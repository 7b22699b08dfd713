"""Issue 30 item 5: HookAdapter on an unmodified nn.TransformerEncoder classifier (nn.MultiheadAttention inside
nn.TransformerEncoderLayer, need_weights=False, the fast path): attention rows and overrides against a hand-written
oracle from the layer's in_proj weights, CLS / mean / named-row pooling, and training bit-identical with an audit."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F

from lightning_xai.adapters import HookAdapter, ProtocolError


class EncoderClassifier(nn.Module):
    """A textbook classifier: embedding (+ learned positions) -> nn.TransformerEncoder -> CLS or mean pooling."""

    def __init__(
        self, pooling: str, vocab: int = 50, dim: int = 8, heads: int = 2, layers: int = 2, batch_first: bool = True
    ) -> None:
        super().__init__()
        self.pooling, self.batch_first = pooling, batch_first
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(128, dim) * 0.5)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=2 * dim, dropout=0.1, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers)
        self.out = nn.Linear(dim, 2)

    def forward(self, ids, pad):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        if not self.batch_first:
            x = x.transpose(0, 1)
        h = self.encoder(x, src_key_padding_mask=pad)
        if not self.batch_first:
            h = h.transpose(0, 1)
        if self.pooling == "first":
            return self.out(h[:, 0])
        keep = (~pad).to(h.dtype)[..., None]
        return self.out((h * keep).sum(1) / keep.sum(1))


def _batch(cls: bool):
    ids = torch.tensor([[1, 11, 25, 37, 48, 9], [1, 17, 9, 0, 0, 0]])
    pad = ids == 0
    mask = ~pad & (ids != 1) if cls else ~pad  # the [CLS] id 1 is no real token; without one every id is
    if not cls:
        ids = torch.where(ids == 1, torch.tensor(5), ids)
    return {"input_ids": ids, "pad": pad, "mask": mask}


def _model(pooling: str, batch_first: bool = True, seed: int = 0) -> EncoderClassifier:
    torch.manual_seed(seed)
    return EncoderClassifier(pooling, batch_first=batch_first).double().eval()


def _forward(model, batch):
    return model(batch["input_ids"], batch["pad"])


def _by_hand(layer: nn.TransformerEncoderLayer, x, pad, override=None, rows=None):
    """One post-norm encoder layer from its weights (batch first): (per-head probabilities, output)."""
    attn = layer.self_attn
    E, H = attn.embed_dim, attn.num_heads
    d = E // H
    q, k, v = (
        F.linear(x, attn.in_proj_weight[i * E : (i + 1) * E], attn.in_proj_bias[i * E : (i + 1) * E])
        .view(x.shape[0], x.shape[1], H, d)
        .transpose(1, 2)
        for i in range(3)
    )
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    probs = scores.masked_fill(pad[:, None, None, :], float("-inf")).softmax(-1)
    if override is not None:
        probs = torch.where(rows[:, None, :, None], override[:, None, None, :].expand_as(probs), probs)
    mixed = (probs @ v).transpose(1, 2).reshape(x.shape)
    h = layer.norm1(x + attn.out_proj(mixed))
    h = layer.norm2(h + layer.linear2(layer.activation(layer.linear1(h))))
    return probs, h


def _oracle(model: EncoderClassifier, batch, rows, override=None):
    """The attention row the classifier reads and the logits, by hand for the last layer."""
    first, last = model.encoder.layers
    x = model.emb(batch["input_ids"]) + model.pos[: batch["input_ids"].shape[1]]
    if model.batch_first:
        x = first(x, src_key_padding_mask=batch["pad"])
    else:
        x = first(x.transpose(0, 1), src_key_padding_mask=batch["pad"]).transpose(0, 1)
    probs, h = _by_hand(last, x, batch["pad"], override, None if rows is None else rows > 0)
    read = (rows[:, None, :, None] * probs).sum(2).mean(1)  # the pooled row(s), heads averaged
    read = read * batch["mask"]
    if model.pooling == "first":
        logits = model.out(h[:, 0])
    else:
        keep = (~batch["pad"]).double()[..., None]
        logits = model.out((h * keep).sum(1) / keep.sum(1))
    return read / read.sum(-1, keepdim=True), logits


@pytest.mark.parametrize("name", ["encoder.layers.1", "encoder.layers.1.self_attn"])
@pytest.mark.parametrize("pooling,batch_first", [("first", True), ("first", False), ("mean", True)])
def test_the_attention_row_and_overrides_equal_a_hand_written_oracle(pooling, batch_first, name):
    model = _model(pooling, batch_first)
    batch = _batch(cls=pooling == "first")
    adapter = HookAdapter(model, embedding="emb", attention=name, pooling=pooling, forward_fn=_forward)
    mask = batch["mask"]
    rows = (
        torch.nn.functional.one_hot(torch.zeros(2, dtype=torch.long), 6).double()
        if pooling == "first"
        else mask.double() / mask.sum(-1, keepdim=True)
    )
    with torch.no_grad():
        expected, logits = _oracle(model, batch, rows)
        out = adapter(batch)
        torch.testing.assert_close(out.attention, expected, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.logits, logits, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.logits, _forward(model, batch), rtol=1e-6, atol=1e-8)  # vs the fast path
        assert out.raw_attentions[0].shape == (2, 2, 6, 6)
        if pooling == "mean":
            assert torch.equal(out.extras["query_mask"], mask) and adapter.query_index is None
        override = torch.tensor([[0.0, 0.1, 0.6, 0.2, 0.05, 0.05], [0.0, 0.3, 0.7, 0.0, 0.0, 0.0]], dtype=torch.float64)
        if pooling == "mean":
            override = torch.tensor(
                [[0.1, 0.1, 0.5, 0.2, 0.05, 0.05], [0.3, 0.3, 0.4, 0.0, 0.0, 0.0]], dtype=torch.float64
            )
        replaced = adapter(batch, attention_override=override)
        _, by_hand = _oracle(model, batch, rows, override)
        torch.testing.assert_close(replaced.logits, by_hand, rtol=1e-10, atol=1e-12)
        assert not torch.allclose(replaced.logits, out.logits)
        torch.testing.assert_close(replaced.attention, override)
        # the override feeds the logits, and gradients reach it
    adapter.probe(batch)
    attn = model.encoder.layers[1].self_attn
    assert not attn._forward_hooks and not attn._forward_pre_hooks and not model.emb._forward_hooks
    assert torch.backends.mha.get_fastpath_enabled()


def test_a_named_row_and_the_pooling_must_be_said():
    model = _model("first")
    batch = _batch(cls=True)
    with torch.no_grad():
        row2 = HookAdapter(model, embedding="emb", attention="encoder.layers.1", query_index=2, forward_fn=_forward)
        rows = torch.nn.functional.one_hot(torch.full((2,), 2), 6).double()
        torch.testing.assert_close(row2(batch).attention, _oracle(model, batch, rows)[0], rtol=1e-10, atol=1e-12)
    unsaid = HookAdapter(model, embedding="emb", attention="encoder.layers.1", forward_fn=_forward)
    with pytest.raises(ProtocolError, match="pooling='first'.*pooling='mean'.*query_index"):
        unsaid(batch)
    with pytest.raises(ValueError, match="pass one"):
        HookAdapter(model, embedding="emb", attention="encoder.layers.1", pooling="mean", query_index=0)
    with pytest.raises(ValueError, match="pooling='cls'"):
        HookAdapter(model, embedding="emb", attention="encoder.layers.1", pooling="cls")
    with pytest.raises(ProtocolError, match="add_bias_kv"):
        HookAdapter(
            nn.ModuleDict({"emb": nn.Embedding(5, 8), "a": nn.MultiheadAttention(8, 2, add_bias_kv=True)}),
            embedding="emb",
            attention="a",
            pooling="first",
        )
    assert torch.backends.mha.get_fastpath_enabled()


def test_the_mean_pooled_model_does_not_read_row_zero():
    """The bug of the issue: a mean-pooled model was reported through its query row 0."""
    model = _model("mean")
    batch = _batch(cls=False)
    mask = batch["mask"]
    with torch.no_grad():
        mean = HookAdapter(model, embedding="emb", attention="encoder.layers.1", pooling="mean", forward_fn=_forward)
        first = HookAdapter(model, embedding="emb", attention="encoder.layers.1", pooling="first", forward_fn=_forward)
        rows = mask.double() / mask.sum(-1, keepdim=True)
        expected = _oracle(model, batch, rows)[0]
        torch.testing.assert_close(mean(batch).attention, expected, rtol=1e-10, atol=1e-12)
        assert not torch.allclose(first(batch).attention, expected, atol=1e-3)


_spec = importlib.util.spec_from_file_location(
    "_lightning_xai_callback_kit_hooks", pathlib.Path(__file__).resolve().parent.parent / "callbacks" / "conftest.py"
)
_kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kit)


class EncoderModule(pl.LightningModule):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.net = EncoderClassifier("mean", vocab=vocab_size, dim=16, heads=2, layers=2)

    def forward(self, batch):
        return self.net(batch["input_ids"], ~batch["mask"])

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch), batch["labels"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch), batch["labels"]))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _fit(tmp_path, audited: bool):
    from lightning_xai.callbacks import AttentionAudit

    dm = _kit.make_dm(train=64, val=32)
    pl.seed_everything(0, verbose=False)
    module = EncoderModule(dm.vocab_size)
    callbacks = []
    if audited:
        callbacks = [
            AttentionAudit(
                model=lambda m: HookAdapter(
                    m.net,
                    embedding="emb",
                    attention="encoder.layers.1",
                    pooling="mean",
                    forward_fn=lambda net, b: net(b["input_ids"], ~b["mask"]),
                ),
                methods=("gradient", "grad_x_input"),
                num_samples=16,
            )
        ]
    trainer = _kit.make_trainer(tmp_path, callbacks, max_epochs=2)
    trainer.fit(module, dm)
    return module, trainer, callbacks


def test_training_with_the_adapter_is_bit_identical_and_the_fast_path_comes_back(tmp_path):
    plain, plain_trainer, _ = _fit(tmp_path / "plain", audited=False)
    audited, audited_trainer, (audit,) = _fit(tmp_path / "audited", audited=True)
    assert [r["epoch"] for r in audit.history] == [0, 1]
    assert -1 <= audit.history[-1]["metrics"]["kendall_tau/attention_vs_gradient/mean"] <= 1
    for key, value in plain.state_dict().items():
        assert torch.equal(value, audited.state_dict()[key]), key
    assert torch.equal(plain_trainer.callback_metrics["val_loss"], audited_trainer.callback_metrics["val_loss"])
    assert torch.backends.mha.get_fastpath_enabled()
    for layer in audited.net.encoder.layers:
        assert not layer.self_attn._forward_hooks and not layer.self_attn._forward_pre_hooks
        assert "forward" not in vars(layer.self_attn)

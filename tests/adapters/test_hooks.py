"""HookAdapter on user-style models: capture, override, gradients vs Captum, clear errors, no leftover hooks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_xai.adapters import ExplainableModel, HookAdapter, ProtocolError


class MaskedSoftmax(nn.Module):
    def forward(self, scores, mask):
        return scores.masked_fill(~mask, float("-inf")).softmax(-1)


class UserModel(nn.Module):
    """What a user writes: embedding -> GRU -> additive attention (softmax in its own module) -> linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8)
        self.rnn = nn.GRU(8, 8, batch_first=True)
        self.score = nn.Linear(8, 1)
        self.attn = MaskedSoftmax()
        self.out = nn.Linear(8, 2)

    def hidden(self, embeddings):
        return self.rnn(embeddings)[0]

    def forward(self, ids, mask):
        h = self.hidden(self.emb(ids))
        a = self.attn(self.score(h).squeeze(-1), mask)
        return self.out(torch.einsum("bt,bth->bh", a, h))


class SelfAttentionModel(nn.Module):
    """A one-layer transformer-ish model whose attention probabilities come out of a named softmax module."""

    def __init__(self, heads=2, dim=8):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.emb = nn.Embedding(50, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.probs = nn.Softmax(dim=-1)
        self.out = nn.Linear(dim, 2)

    def forward(self, ids, attention_mask):
        x = self.emb(ids)
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.dim // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (self.dim // self.heads) ** 0.5
        scores = scores.masked_fill(~attention_mask[:, None, None, :], float("-inf"))
        mixed = (self.probs(scores) @ v).transpose(1, 2).reshape(B, T, self.dim)
        return self.out(mixed[:, 0])


@pytest.fixture
def user_batch():
    return {
        "input_ids": torch.tensor([[4, 9, 7, 12, 0], [3, 5, 0, 0, 0]]),
        "mask": torch.tensor([[True, True, True, True, False], [True, True, False, False, False]]),
    }


def _user_adapter(seed=0):
    torch.manual_seed(seed)
    return HookAdapter(
        UserModel().double(),
        embedding="emb",
        attention="attn",
        hidden="rnn",
        forward_fn=lambda m, b: m(b["input_ids"], b["mask"]),
    )


def test_capture_matches_a_manual_forward(user_batch):
    adapter = _user_adapter()
    assert isinstance(adapter, ExplainableModel)
    model = adapter.module
    out = adapter(user_batch)
    h = model.hidden(model.emb(user_batch["input_ids"]))
    manual = model.attn(model.score(h).squeeze(-1), user_batch["mask"])
    torch.testing.assert_close(out.attention, manual)
    torch.testing.assert_close(out.logits, model(user_batch["input_ids"], user_batch["mask"]))
    torch.testing.assert_close(out.hidden_states, h)
    assert not model.emb._forward_hooks and not model.attn._forward_hooks and not model.rnn._forward_hooks


def test_override_replaces_the_attention_the_model_consumes(user_batch):
    adapter = _user_adapter()
    model = adapter.module
    uniform = user_batch["mask"].double() / user_batch["mask"].sum(-1, keepdim=True)
    out = adapter(user_batch, attention_override=uniform)
    h = model.hidden(model.emb(user_batch["input_ids"]))
    torch.testing.assert_close(out.logits, model.out(torch.einsum("bt,bth->bh", uniform, h)))
    torch.testing.assert_close(out.attention, uniform)
    own = adapter(user_batch)
    torch.testing.assert_close(adapter(user_batch, attention_override=own.attention).logits, own.logits)
    with pytest.raises(ValueError, match="expected the token mask's"):
        adapter(user_batch, attention_override=torch.ones(2, 3))


def test_forward_from_embeddings_substitutes_the_embeddings(user_batch):
    adapter = _user_adapter()
    embeddings = adapter.embed(user_batch)
    shifted = adapter.forward_from_embeddings(embeddings + 0.5, user_batch).logits
    model = adapter.module
    h = model.hidden(model.emb(user_batch["input_ids"]) + 0.5)
    expected = model.out(torch.einsum("bt,bth->bh", model.attn(model.score(h).squeeze(-1), user_batch["mask"]), h))
    torch.testing.assert_close(shifted, expected)


def test_gradients_agree_with_captum(user_batch):
    from captum.attr import LayerIntegratedGradients

    adapter = _user_adapter(seed=1)
    model = adapter.module
    target = torch.tensor([1, 0])
    with torch.no_grad():  # Captum's layer baseline is the layer's output at the baseline input (all pads): zero it
        model.emb.weight[0].zero_()
    embeddings = adapter.embed(user_batch).detach()
    baseline = torch.zeros_like(embeddings)
    n = 20
    total = torch.zeros_like(embeddings)
    for k in range(1, n + 1):
        point = (baseline + k / n * (embeddings - baseline)).requires_grad_(True)
        logits = adapter.forward_from_embeddings(point, user_batch).logits
        total += torch.autograd.grad(logits.gather(1, target[:, None]).sum(), point)[0]
    ours = embeddings * total / n
    lig = LayerIntegratedGradients(lambda ids: model(ids, user_batch["mask"].repeat(ids.shape[0] // 2, 1)), model.emb)
    captum = lig.attribute(
        user_batch["input_ids"],
        baselines=torch.zeros_like(user_batch["input_ids"]),
        target=target,
        n_steps=n,
        method="riemann_right",
    )
    torch.testing.assert_close(ours, captum, rtol=0, atol=1e-8)  # Captum builds its alphas in float32


def test_self_attention_outputs_use_the_query_row():
    torch.manual_seed(0)
    model = SelfAttentionModel().double()
    adapter = HookAdapter(
        model,
        embedding="emb",
        attention="probs",
        pooling="first",
        forward_fn=lambda m, b: m(b["input_ids"], b["attention_mask"]),
    )
    batch = {
        "input_ids": torch.tensor([[1, 4, 9, 2, 0]]),
        "attention_mask": torch.tensor([[True] * 4 + [False]]),
        "mask": torch.tensor([[False, True, True, False, False]]),
    }
    out = adapter(batch)
    assert out.raw_attentions[0].shape == (1, 2, 5, 5)
    row = out.raw_attentions[0][:, :, 0].mean(1) * batch["mask"]
    torch.testing.assert_close(out.attention, row / row.sum(-1, keepdim=True))
    override = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    new = adapter(batch, attention_override=override)
    v = model.qkv(model.emb(batch["input_ids"])).view(1, 5, 3, 2, 4)[:, :, 2].transpose(1, 2)  # [B, H, T, d]
    expected = model.out(v[:, :, 1].reshape(1, 8))
    torch.testing.assert_close(new.logits, expected)


def test_clear_errors(user_batch):
    model = UserModel()
    with pytest.raises(ProtocolError, match="no submodule 'embeddings'.*emb, rnn, score, attn, out"):
        HookAdapter(model, embedding="embeddings", attention="attn")
    adapter = HookAdapter(
        model, embedding="emb", attention="score", forward_fn=lambda m, b: m(b["input_ids"], b["mask"])
    )
    with pytest.raises(ProtocolError, match=r"attention weights of shape \(2, 5, 1\); expected \[B, T\] or"):
        adapter(user_batch)
    unused = HookAdapter(
        model, embedding="emb", attention="rnn", forward_fn=lambda m, b: m.out(m.emb(b["input_ids"]).mean(1))
    )
    with pytest.raises(ProtocolError, match="did not run during the forward pass"):
        unused(user_batch)
    with pytest.raises(KeyError, match="no 'mask'"):
        HookAdapter(model, embedding="emb", attention="attn").token_mask({"input_ids": user_batch["input_ids"]})
    assert not model.emb._forward_hooks and not model.rnn._forward_hooks

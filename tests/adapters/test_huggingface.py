"""HuggingFaceAdapter on tiny random BERTs (exact checks) and on the bundled MiniLM (real model, small slices)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from lightning_xai.adapters import ExplainableModel, HuggingFaceAdapter, ProtocolError, attention_rollout


def _sentences(dataset: str, n: int):
    from lightning_xai.data import read_split

    return read_split(dataset, "val")[:n]


def _minilm_batch(tokenizer, dataset: str = "sst2", n: int = 6):
    from lightning_xai.data.hf import WordDataset, WordPieceCollator

    data = WordDataset(_sentences(dataset, n))
    return WordPieceCollator(tokenizer)([data[i] for i in range(len(data))])


# --- protocol, reductions, token mask ---------------------------------------------------------------------------
def test_protocol_and_reduction_is_a_distribution_over_real_tokens(make_tiny_bert, batch):
    model = make_tiny_bert()
    own = model.config._attn_implementation
    adapter = HuggingFaceAdapter(model)
    assert isinstance(adapter, ExplainableModel)
    assert adapter.model.config._attn_implementation == own  # switched only inside the adapter's passes
    out = adapter(batch)
    assert adapter.model.config._attn_implementation == own
    mask = batch["mask"]
    assert out.logits.shape == (2, 2)
    assert len(out.raw_attentions) == 3 and out.raw_attentions[0].shape == (2, 4, 6, 6)
    assert torch.all(out.attention[~mask] == 0)
    torch.testing.assert_close(out.attention.sum(-1), torch.ones(2, dtype=torch.float64))
    # the reduction is the mean over heads of the last layer's [CLS] row, renormalised over real tokens
    row = out.raw_attentions[-1][:, :, 0, :].mean(1) * mask
    torch.testing.assert_close(out.attention, row / row.sum(-1, keepdim=True))
    # pads receive exactly no attention in any layer
    for layer in out.raw_attentions:
        assert torch.all(layer[1, :, :, 4:] == 0)
    assert out.hidden_states.shape == (2, 6, 16)


def test_logits_match_the_model_run_on_input_ids(make_tiny_bert, batch):
    model = make_tiny_bert()
    reference = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    out = HuggingFaceAdapter(model)(batch)
    torch.testing.assert_close(out.logits, reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["cls_last_max", "1:2", "-1:mean", "0:max"])
def test_other_reductions(make_tiny_bert, batch, name):
    out = HuggingFaceAdapter(make_tiny_bert(), attention=name)(batch)
    raw = out.raw_attentions
    expected = {
        "cls_last_max": raw[-1][:, :, 0].amax(1),
        "1:2": raw[1][:, 2, 0],
        "-1:mean": raw[-1][:, :, 0].mean(1),
        "0:max": raw[0][:, :, 0].amax(1),
    }[name] * batch["mask"]
    torch.testing.assert_close(out.attention, expected / expected.sum(-1, keepdim=True))


def test_callable_reduction_and_bad_names(make_tiny_bert, batch):
    first_layer_cls = lambda raw, b: raw[0][:, 0, 0]  # noqa: E731
    out = HuggingFaceAdapter(make_tiny_bert(), attention=first_layer_cls)(batch)
    expected = out.raw_attentions[0][:, 0, 0] * batch["mask"]
    torch.testing.assert_close(out.attention, expected / expected.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="Unknown attention reduction"):
        HuggingFaceAdapter(make_tiny_bert(), attention="cls_first")
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        HuggingFaceAdapter(make_tiny_bert(), attention="7:0")(batch)
    with pytest.raises(ValueError, match="head 9 does not exist"):
        HuggingFaceAdapter(make_tiny_bert(), attention="0:9")(batch)
    head_maps = lambda raw, b: raw[0][:, :, 0]  # noqa: E731  # [B, heads, T]: not one map per row
    T = batch["input_ids"].shape[1]
    with pytest.raises(ValueError, match=rf"reduction returned shape \(\d+, \d+, {T}\); expected \(\d+, {T}\)"):
        HuggingFaceAdapter(make_tiny_bert(), attention=head_maps)(batch)


def test_rollout_matches_a_hand_computation(make_tiny_bert, batch):
    out = HuggingFaceAdapter(make_tiny_bert(), attention="rollout")(batch)
    raw = [layer.detach().numpy() for layer in out.raw_attentions]
    for b in range(2):
        T = raw[0].shape[-1]
        joint = np.eye(T)
        for layer in raw:
            a = np.zeros((T, T))
            for h in range(layer.shape[1]):
                a += layer[b, h] / layer.shape[1]
            a = 0.5 * a + 0.5 * np.eye(T)
            for i in range(T):
                a[i] /= a[i].sum()
            joint = a @ joint
        cls = joint[0] * batch["mask"][b].numpy()
        np.testing.assert_allclose(out.attention[b].detach().numpy(), cls / cls.sum(), rtol=0, atol=1e-12)
    # the raw rollout row sums to 1 over all positions and is not the last layer's attention
    full = attention_rollout(out.raw_attentions)
    torch.testing.assert_close(full.sum(-1), torch.ones(2, dtype=torch.float64))
    assert not torch.allclose(out.attention, HuggingFaceAdapter(make_tiny_bert())(batch).attention, atol=1e-3)


def test_token_mask_from_tokenizer_when_the_batch_has_none(tokenizer, minilm):
    batch = _minilm_batch(tokenizer, n=3)
    adapter = HuggingFaceAdapter(minilm, tokenizer)
    derived = adapter.token_mask({k: v for k, v in batch.items() if k != "mask"})
    assert torch.equal(derived, batch["mask"])
    ids = batch["input_ids"]
    assert not derived[ids == tokenizer.cls_token_id].any() and not derived[ids == tokenizer.sep_token_id].any()
    assert not derived[batch["attention_mask"] == 0].any()
    # no tokenizer, and a BERT config names no special token but pad: specials count as real, with a warning
    with pytest.warns(UserWarning, match="specials|special tokens"):
        bare = HuggingFaceAdapter(minilm).token_mask({"input_ids": ids, "attention_mask": batch["attention_mask"]})
    assert torch.equal(bare, batch["attention_mask"].bool())


# --- attention_override ------------------------------------------------------------------------------------------
def test_override_with_own_cls_rows_reproduces_logits_exactly(make_tiny_bert, batch):
    adapter = HuggingFaceAdapter(make_tiny_bert())
    out = adapter(batch)
    again = adapter(batch, attention_override=out.extras["cls_rows"])
    assert torch.equal(again.logits, out.logits)
    assert all(torch.equal(a, b) for a, b in zip(again.raw_attentions, out.raw_attentions))


def test_override_replaces_only_the_last_layer_cls_row(make_tiny_bert, batch):
    adapter = HuggingFaceAdapter(make_tiny_bert(), override_specials="zero")
    out = adapter(batch)
    uniform = batch["mask"].double() / batch["mask"].sum(-1, keepdim=True)
    new = adapter(batch, attention_override=uniform)
    for before, after in zip(out.raw_attentions[:-1], new.raw_attentions[:-1]):
        assert torch.equal(before, after)
    assert torch.equal(new.raw_attentions[-1][:, :, 1:], out.raw_attentions[-1][:, :, 1:])
    assert torch.equal(new.raw_attentions[-1][:, :, 0], uniform.unsqueeze(1).expand(2, 4, 6))
    torch.testing.assert_close(new.attention, uniform)
    assert not torch.allclose(new.logits, out.logits, atol=1e-6)


def test_override_keep_mode_preserves_special_mass(make_tiny_bert, batch):
    adapter = HuggingFaceAdapter(make_tiny_bert())
    out = adapter(batch)
    uniform = batch["mask"].double() / batch["mask"].sum(-1, keepdim=True)
    rows = adapter(batch, attention_override=uniform).raw_attentions[-1][:, :, 0]
    special = batch["attention_mask"].bool() & ~batch["mask"]
    own = out.extras["cls_rows"]
    torch.testing.assert_close(rows * special.unsqueeze(1), own * special.unsqueeze(1), rtol=0, atol=0)
    torch.testing.assert_close(rows.sum(-1), torch.ones(2, 4, dtype=torch.float64))
    real = rows * batch["mask"].unsqueeze(1)
    torch.testing.assert_close(real / real.sum(-1, keepdim=True), uniform.unsqueeze(1).expand(2, 4, 6))


def test_token_level_override_with_own_reduction_is_exact_for_one_head(make_tiny_bert, batch):
    adapter = HuggingFaceAdapter(make_tiny_bert(heads=1))
    out = adapter(batch)
    again = adapter(batch, attention_override=out.attention)
    torch.testing.assert_close(again.logits, out.logits, rtol=0, atol=1e-12)
    permuted = out.attention[:, [0, 2, 1, 4, 3, 5]] * batch["mask"]
    permuted = permuted / permuted.sum(-1, keepdim=True)
    assert not torch.allclose(adapter(batch, attention_override=permuted).logits, out.logits, atol=1e-9)


def test_override_shape_errors(make_tiny_bert, batch):
    adapter = HuggingFaceAdapter(make_tiny_bert())
    with pytest.raises(ValueError, match="expected the token mask's"):
        adapter(batch, attention_override=torch.ones(2, 5))
    with pytest.raises(ValueError, match="has 3 heads; the last layer has 4"):
        adapter(batch, attention_override=torch.ones(2, 3, 6))
    with pytest.raises(ValueError, match=r"must be \[B, T\] or \[B, heads, T\]"):
        adapter(batch, attention_override=torch.ones(2))


def test_override_is_differentiable(make_tiny_bert, batch):
    adapter = HuggingFaceAdapter(make_tiny_bert())
    override = (batch["mask"].double() / batch["mask"].sum(-1, keepdim=True)).requires_grad_(True)
    adapter(batch, attention_override=override).logits[:, 1].sum().backward()
    assert override.grad is not None and override.grad[batch["mask"]].abs().sum() > 0


def test_override_with_own_rows_is_exact_on_minilm(tokenizer, minilm):
    batch = _minilm_batch(tokenizer, n=4)
    adapter = HuggingFaceAdapter(minilm, tokenizer)
    with torch.no_grad():
        out = adapter(batch)
        again = adapter(batch, attention_override=out.extras["cls_rows"])
        uniform = adapter(batch, attention_override=batch["mask"].float() / batch["mask"].sum(-1, keepdim=True))
    assert torch.equal(again.logits, out.logits)
    assert not torch.allclose(uniform.logits, out.logits, atol=1e-5)
    assert len(out.raw_attentions) == 6 and out.raw_attentions[-1].shape[1] == 12


# --- gradients agree with Captum ---------------------------------------------------------------------------------
def _captum_forward(model, batch):
    def forward(input_ids):
        rows = input_ids.shape[0] // batch["attention_mask"].shape[0]
        return model(
            input_ids=input_ids,
            attention_mask=batch["attention_mask"].repeat(rows, 1),
            token_type_ids=batch["token_type_ids"].repeat(rows, 1),
        ).logits

    return forward


def _pad_baseline(batch):
    return torch.where(batch["mask"], torch.zeros_like(batch["input_ids"]), batch["input_ids"])


def _adapter_ig(adapter, batch, target, n_steps):
    """Riemann-right IG of the adapter from embed(): (e - e') · mean_k ∂F/∂e(e' + k/n (e - e'))."""
    embeddings = adapter.embed(batch).detach()
    baseline = adapter.embed({**batch, "input_ids": _pad_baseline(batch)}).detach()
    total = torch.zeros_like(embeddings)
    for k in range(1, n_steps + 1):
        point = (baseline + k / n_steps * (embeddings - baseline)).requires_grad_(True)
        logits = adapter.forward_from_embeddings(point, batch).logits
        (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), point)
        total += grad
    return (embeddings - baseline) * total / n_steps


def test_gradient_and_ig_agree_with_captum_on_tiny_bert(make_tiny_bert, batch):
    from captum.attr import LayerGradientXActivation, LayerIntegratedGradients

    model = make_tiny_bert(seed=3)
    adapter = HuggingFaceAdapter(model)
    target = torch.tensor([1, 0])
    embeddings = adapter.embed(batch).detach().requires_grad_(True)
    logits = adapter.forward_from_embeddings(embeddings, batch).logits
    (grad,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), embeddings)
    layer = model.bert.embeddings.word_embeddings
    captum_grad = LayerGradientXActivation(_captum_forward(model, batch), layer, multiply_by_inputs=False).attribute(
        batch["input_ids"], target=target
    )
    torch.testing.assert_close(grad, captum_grad, rtol=0, atol=1e-10)
    lig = LayerIntegratedGradients(_captum_forward(model, batch), layer)
    captum_ig = lig.attribute(
        batch["input_ids"], baselines=_pad_baseline(batch), target=target, n_steps=16, method="riemann_right"
    )
    torch.testing.assert_close(_adapter_ig(adapter, batch, target, 16), captum_ig, rtol=0, atol=1e-10)


def test_ig_agrees_with_captum_on_minilm(tokenizer, minilm):
    from captum.attr import LayerIntegratedGradients

    batch = _minilm_batch(tokenizer, n=2)
    adapter = HuggingFaceAdapter(minilm, tokenizer)
    target = torch.tensor([0, 1])
    lig = LayerIntegratedGradients(_captum_forward(minilm, batch), minilm.bert.embeddings.word_embeddings)
    captum_ig = lig.attribute(
        batch["input_ids"], baselines=_pad_baseline(batch), target=target, n_steps=8, method="riemann_right"
    )
    ours = _adapter_ig(adapter, batch, target, 8)
    assert (ours - captum_ig).abs().max() < 1e-4
    assert captum_ig.abs().max() > 1e-3  # not trivially zero


# --- clear errors --------------------------------------------------------------------------------------------------
def test_sdpa_model_keeps_sdpa_outside_the_adapters_passes(make_tiny_bert, batch):
    model = make_tiny_bert(attn_implementation="sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the model is not switched for good
        adapter = HuggingFaceAdapter(model)
    assert model.config._attn_implementation == "sdpa"
    out = adapter(batch)
    assert len(out.raw_attentions) == 3 and model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(out.logits, HuggingFaceAdapter(make_tiny_bert())(batch).logits, rtol=0, atol=1e-12)


def test_model_without_embedding_layer_is_refused():
    class NoEmbedding(nn.Module):
        def get_input_embeddings(self):
            raise NotImplementedError

    with pytest.raises(ProtocolError, match="no reachable input embedding layer.*HookAdapter"):
        HuggingFaceAdapter(NoEmbedding())
    with pytest.raises(ProtocolError, match="no reachable input embedding layer"):
        HuggingFaceAdapter(nn.Linear(2, 2))


def test_model_that_returns_no_attention_is_refused(make_tiny_bert, batch):
    class NotInterfaced(nn.Module):
        """An embedding-bearing model whose attention is not dispatched through transformers."""

        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(60, 4)

        def get_input_embeddings(self):
            return self.embedding

    with pytest.raises(ProtocolError, match="does not dispatch attention through transformers' AttentionInterface"):
        HuggingFaceAdapter(NotInterfaced(), query_index=0)  # pooling given: the attention check fires


def test_tokenizer_model_mismatch(make_tiny_bert, tokenizer, batch):
    with pytest.raises(ValueError, match="Tokenizer/model mismatch: the tokenizer has 30522 tokens"):
        HuggingFaceAdapter(make_tiny_bert(), tokenizer)
    adapter = HuggingFaceAdapter(make_tiny_bert())
    with pytest.raises(ValueError, match="input_ids contain id 1000"):
        adapter.embed({**batch, "input_ids": batch["input_ids"].clone().fill_(1000)})


def test_too_long_sequences_are_refused_with_the_fix(make_tiny_bert):
    adapter = HuggingFaceAdapter(make_tiny_bert())
    ids = torch.full((1, 40), 5)
    with pytest.raises(ValueError, match="40 word-pieces exceed the model's max length 32.*WordPieceCollator"):
        adapter.embed({"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def test_missing_attention_mask(make_tiny_bert, batch):
    adapter = HuggingFaceAdapter(make_tiny_bert())
    with pytest.raises(KeyError, match="no 'attention_mask'"):
        adapter({k: v for k, v in batch.items() if k != "attention_mask"})


# --- lightning_xai.attribution through the adapter, against Captum on the embedding layer --------------------------
def _captum_probability_forward(model, batch):
    forward = _captum_forward(model, batch)
    return lambda input_ids: forward(input_ids).softmax(-1)


@pytest.mark.filterwarnings("ignore:Integrated gradients. convergence delta")
@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_attribute_ig_and_gradient_match_captum_layer_attributions(which, make_tiny_bert, batch, tokenizer, minilm):
    from captum.attr import LayerGradientXActivation, LayerIntegratedGradients

    from lightning_xai.attribution import attribute

    if which == "tiny":
        model, adapter = make_tiny_bert(seed=5), None
        adapter = HuggingFaceAdapter(model)
    else:
        model, batch = minilm, _minilm_batch(tokenizer, n=2)
        adapter = HuggingFaceAdapter(model, tokenizer)
    target = torch.tensor([1, 0])
    layer = model.bert.embeddings.word_embeddings
    forward = _captum_probability_forward(model, batch)
    ours = attribute(
        adapter, batch, "integrated_gradients", target=target, n_steps=16, rule="riemann_right", baseline="pad"
    )
    theirs = LayerIntegratedGradients(forward, layer).attribute(
        batch["input_ids"], baselines=_pad_baseline(batch), target=target, n_steps=16, method="riemann_right"
    )
    theirs = theirs.sum(-1) * batch["mask"]
    assert (ours - theirs).abs().max() < 1e-4 and theirs.abs().max() > 1e-4
    grad = attribute(adapter, batch, "gradient", target=target)
    captum_grad = (
        LayerGradientXActivation(forward, layer, multiply_by_inputs=False)
        .attribute(batch["input_ids"], target=target)
        .norm(dim=-1)
        * batch["mask"]
    )
    assert (grad - captum_grad).abs().max() < 1e-4 and captum_grad.abs().max() > 1e-5

"""LRP for the reference LSTM / MLP + attention models: oracles are nn.LSTM itself, a NumPy port of Arras et
al.'s reference ``LRP_for_LSTM`` code, and Captum's InputXGradient on a linear model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from captum.attr import InputXGradient
from torch import nn

from lightning_xai.adapters import ProtocolError
from lightning_xai.attribution.lrp import (
    LRP_ENCODER_RULES,
    lrp,
    lrp_linear,
    lstm_forward,
    lstm_rule,
    per_token_rule,
    register_lrp_encoder,
)
from lightning_xai.data import TextClassificationDataModule, collate
from lightning_xai.models import AttentionClassifier
from lightning_xai.models.encoders import LSTMEncoder

VOCAB = 20000  # covers the SST-2 vocabulary of the sst2_batch fixture


def _ragged_batch(vocab_size: int, lengths, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(1, vocab_size, (length,), generator=generator)
        mask[row, :length] = True
    return {"input_ids": ids, "mask": mask, "labels": torch.zeros(len(lengths), dtype=torch.long)}


# --- the Python LSTM equals nn.LSTM ------------------------------------------------------------------------
@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_rerun_matches_packed_nn_lstm(bidirectional):
    torch.manual_seed(0)
    encoder = LSTMEncoder(5, 4, bidirectional=bidirectional).double()
    x = torch.randn(3, 7, 5, dtype=torch.double)
    input_mask = torch.arange(7).unsqueeze(0) < torch.tensor([[7], [3], [1]])
    expected = encoder(x, input_mask)
    rnn = encoder.rnn
    forward = lstm_forward(x, input_mask.sum(1), rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0)
    torch.testing.assert_close(forward["h"], expected[..., :4], rtol=0, atol=1e-12)
    if bidirectional:
        backward = lstm_forward(
            x,
            input_mask.sum(1),
            rnn.weight_ih_l0_reverse,
            rnn.weight_hh_l0_reverse,
            rnn.bias_ih_l0_reverse,
            rnn.bias_hh_l0_reverse,
            reverse=True,
        )
        torch.testing.assert_close(backward["h"], expected[..., 4:], rtol=0, atol=1e-12)
        # the reverse direction starts afresh at each row's last real token
        assert backward["first"][1].nonzero().flatten().tolist() == [2]


# --- LSTM rule vs a NumPy port of Arras et al.'s reference implementation ------------------------------------
def _arras_lrp_linear(hin, w, b, hout, rout, bias_nb_units, eps, bias_factor=0.0):
    """Verbatim logic of ``lrp_linear`` in github.com/ArrasL/LRP_for_LSTM (w: [D, M])."""
    sign_out = np.where(hout[None, :] >= 0, 1.0, -1.0)
    numer = (w * hin[:, None]) + (bias_factor * (b[None, :] * 1.0 + eps * sign_out * 1.0) / bias_nb_units)
    denom = hout[None, :] + (eps * sign_out * 1.0)
    return ((numer / denom) * rout[None, :]).sum(axis=1)


def _arras_lstm_lrp(x, w_ih, w_hh, b, r_h_out, eps):
    """Arras et al.'s backward pass of one LSTM direction (gates in PyTorch's order i, f, g, o)."""
    steps, e = x.shape
    d = w_hh.shape[1]
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    h, c = np.zeros((steps + 1, d)), np.zeros((steps + 1, d))  # index -1 holds the zero initial state
    gates_pre, gates = np.zeros((steps, 4 * d)), np.zeros((steps, 4 * d))
    i_, f_, g_, o_ = (slice(k * d, (k + 1) * d) for k in range(4))
    for t in range(steps):
        gates_pre[t] = w_ih @ x[t] + w_hh @ h[t - 1] + b
        gates[t, i_], gates[t, f_], gates[t, o_] = sig(gates_pre[t, i_]), sig(gates_pre[t, f_]), sig(gates_pre[t, o_])
        gates[t, g_] = np.tanh(gates_pre[t, g_])
        c[t] = gates[t, f_] * c[t - 1] + gates[t, i_] * gates[t, g_]
        h[t] = gates[t, o_] * np.tanh(c[t])
    r_x, r_h, r_c, r_g = np.zeros((steps, e)), np.zeros((steps + 1, d)), np.zeros((steps + 1, d)), np.zeros((steps, d))
    r_h[:steps] = r_h_out
    for t in reversed(range(steps)):
        r_c[t] += r_h[t]
        r_c[t - 1] = _arras_lrp_linear(gates[t, f_] * c[t - 1], np.identity(d), np.zeros(d), c[t], r_c[t], 2 * d, eps)
        r_g[t] = _arras_lrp_linear(gates[t, i_] * gates[t, g_], np.identity(d), np.zeros(d), c[t], r_c[t], 2 * d, eps)
        r_x[t] = _arras_lrp_linear(x[t], w_ih[g_].T, b[g_], gates_pre[t, g_], r_g[t], d + e, eps)
        r_h[t - 1] += _arras_lrp_linear(h[t - 1], w_hh[g_].T, b[g_], gates_pre[t, g_], r_g[t], d + e, eps)
    return r_x, h[:steps]


def test_lstm_rule_matches_arras_reference_code():
    torch.manual_seed(1)
    encoder = LSTMEncoder(6, 5, bidirectional=True).double()
    x = torch.randn(1, 8, 6, dtype=torch.double)
    mask = torch.ones(1, 8, dtype=torch.bool)
    r_hidden = torch.randn(1, 8, 10, dtype=torch.double)
    ours, hidden = lstm_rule(encoder, x, mask, r_hidden, eps=1e-3, bias_factor=0.0)
    rnn = encoder.rnn
    p = lambda t: t.detach().numpy()  # noqa: E731
    fwd_x, fwd_h = _arras_lstm_lrp(
        p(x[0]),
        p(rnn.weight_ih_l0),
        p(rnn.weight_hh_l0),
        p(rnn.bias_ih_l0 + rnn.bias_hh_l0),
        p(r_hidden[0, :, :5]),
        1e-3,
    )
    bwd_x, bwd_h = _arras_lstm_lrp(
        p(x[0]).copy()[::-1],
        p(rnn.weight_ih_l0_reverse),
        p(rnn.weight_hh_l0_reverse),
        p(rnn.bias_ih_l0_reverse + rnn.bias_hh_l0_reverse),
        p(r_hidden[0, :, 5:])[::-1],
        1e-3,
    )
    np.testing.assert_allclose(p(hidden[0]), np.concatenate([fwd_h, bwd_h[::-1]], axis=1), atol=1e-12)
    np.testing.assert_allclose(p(ours[0]), fwd_x + bwd_x[::-1], rtol=1e-9, atol=1e-12)


# --- conservation on the reference model --------------------------------------------------------------------
def test_conservation_within_one_percent_on_trained_bilstm(trained_model, sst2_batch):
    logits = trained_model(sst2_batch).logits.detach()
    top = logits.max(-1).values
    relevance, delta = lrp(trained_model, sst2_batch, eps=1e-6, bias_factor=1.0, return_convergence_delta=True)
    assert relevance.shape == sst2_batch["input_ids"].shape
    assert (relevance[~sst2_batch["mask"]] == 0).all()
    assert (delta.abs() <= 0.01 * top.abs()).all(), delta / top
    torch.testing.assert_close(relevance.sum(1), top, rtol=1e-3, atol=1e-5)
    # With the biases absorbing their share (Arras et al.'s default) relevance is visibly not conserved ...
    _, absorbed = lrp(trained_model, sst2_batch, eps=1e-6, bias_factor=0.0, return_convergence_delta=True)
    assert absorbed.abs().max() > 0.05 * top.abs().max()


def test_without_biases_both_bias_modes_agree_and_conserve(sst2_batch):
    torch.manual_seed(0)
    model = (
        AttentionClassifier(
            vocab_size=int(sst2_batch["input_ids"].max()) + 1, embedding_dim=12, hidden_dim=6, embedding_std=0.3
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "bias" in name and not name.startswith("attention"):
                param.zero_()
    absorbed, delta0 = lrp(model, sst2_batch, eps=0.0, bias_factor=0.0, return_convergence_delta=True)
    spread, delta1 = lrp(model, sst2_batch, eps=0.0, bias_factor=1.0, return_convergence_delta=True)
    torch.testing.assert_close(absorbed, spread, rtol=1e-12, atol=1e-12)
    assert delta0.abs().max() < 1e-6 and delta1.abs().max() < 1e-9


def test_sos_eos_rows_and_explicit_target():
    dm = TextClassificationDataModule("sst2", add_sos_eos=True)
    dataset = dm.dataset("val")
    batch = collate([dataset[i] for i in range(6)])
    assert "input_mask" in batch
    torch.manual_seed(0)
    model = AttentionClassifier(dm.vocab_size, embedding_dim=8, hidden_dim=4, embedding_std=0.3).eval()
    relevance, delta = lrp(
        model, batch, target=torch.tensor([0, 1, 0, 1, 0, 1]), bias_factor=1.0, return_convergence_delta=True
    )
    assert (relevance[~batch["mask"]] == 0).all()
    assert relevance[:, 0].eq(0).all()  # <sos>
    assert relevance[batch["mask"]].ne(0).all()
    # with bias_factor=1 only the relevance that <sos>/<eos> received is missing from the token map
    assert torch.isfinite(delta).all() and delta.abs().max() > 0


def test_mlp_encoder_conserves_with_bias_factor_one(sst2_batch):
    torch.manual_seed(0)
    model = (
        AttentionClassifier(int(sst2_batch["input_ids"].max()) + 1, encoder="mlp", embedding_dim=12, hidden_dim=6)
        .double()
        .eval()
    )
    _, delta = lrp(model, sst2_batch, eps=1e-3, bias_factor=1.0, return_convergence_delta=True)
    assert delta.abs().max() < 1e-10


# --- linear model: LRP-0 without biases is exactly gradient x input ---------------------------------------
class LinearTokenEncoder(nn.Module):
    """h_t = W x_t (no bias, no activation): with uniform attention the whole classifier is linear."""

    def __init__(self, embedding_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(embedding_dim, hidden_dim, bias=False)
        self.output_dim = hidden_dim

    def forward(self, embeddings, input_mask):
        return self.proj(embeddings) * input_mask.unsqueeze(-1)


@pytest.fixture
def linear_rule_registered():
    register_lrp_encoder(LinearTokenEncoder)(per_token_rule)
    yield
    LRP_ENCODER_RULES.pop(LinearTokenEncoder)


def _linear_model(vocab_size: int, encoder_cls=LinearTokenEncoder) -> AttentionClassifier:
    torch.manual_seed(3)
    model = AttentionClassifier(vocab_size, 3, encoder="mlp", attention="uniform", embedding_dim=10, hidden_dim=7)
    if encoder_cls is not None:
        model.encoder = encoder_cls(10, 7)
    model.classifier = nn.Linear(7, 3, bias=False)
    return model.double().eval()


def _captum_grad_x_input(model, batch, target):
    embeddings = model.embed(batch).detach()
    forward = lambda emb: model.forward_from_embeddings(emb, batch).logits  # noqa: E731
    return InputXGradient(forward).attribute(embeddings, target=target).sum(-1) * batch["mask"]


def test_linear_model_lrp_equals_grad_x_input_exactly(linear_rule_registered):
    batch = _ragged_batch(30, [9, 4, 1, 6])
    model = _linear_model(30)
    for target in (0, 2):
        relevance = lrp(model, batch, target=target, eps=0.0)
        torch.testing.assert_close(relevance, _captum_grad_x_input(model, batch, target), rtol=1e-12, atol=1e-14)


def test_tanh_model_lrp_differs_from_grad_x_input():
    """The same check fails where it should: the MLP encoder's tanh makes LRP's identity rule differ."""
    batch = _ragged_batch(30, [9, 4, 1, 6])
    model = _linear_model(30, encoder_cls=None)
    with torch.no_grad():
        model.encoder.proj.bias.zero_()
        model.embedding.weight.mul_(3)
    relevance = lrp(model, batch, target=1, eps=0.0)
    assert not torch.allclose(relevance, _captum_grad_x_input(model, batch, 1), rtol=1e-3, atol=1e-6)


def test_lrp_linear_matches_hand_computation():
    x = torch.tensor([1.0, 2.0, -1.0])
    w = torch.tensor([[1.0, 0.5, 2.0]])
    b = torch.tensor([0.5])
    z = x @ w.T + b  # 1 + 1 - 2 + 0.5 = 0.5
    r = lrp_linear(x, w, b, z, torch.tensor([2.0]), eps=0.5, bias_factor=0.0)
    torch.testing.assert_close(r, torch.tensor([1.0, 1.0, -2.0]) * 2.0 / 1.0)
    r = lrp_linear(x, w, b, z, torch.tensor([2.0]), eps=0.5, bias_factor=1.0)
    torch.testing.assert_close(r.sum(), torch.tensor(2.0))


# --- differentiability, modes, errors ----------------------------------------------------------------------
def test_create_graph_gives_gradients_and_restores_mode(trained_model, sst2_batch):
    trained_model.train()
    try:
        relevance = lrp(trained_model, sst2_batch, create_graph=True)
        assert trained_model.training
        relevance.abs().sum().backward()
        assert trained_model.embedding.weight.grad is not None
        assert trained_model.embedding.weight.grad.abs().sum() > 0
    finally:
        trained_model.zero_grad(set_to_none=True)
        trained_model.eval()
    assert not lrp(trained_model, sst2_batch).requires_grad


def test_works_inside_inference_mode(trained_model, sst2_batch):
    expected = lrp(trained_model, sst2_batch)
    with torch.inference_mode():
        inside = lrp(trained_model, {k: v.clone() for k, v in sst2_batch.items()})
    torch.testing.assert_close(inside, expected)


def test_unsupported_models_get_a_clear_error(sst2_batch):
    cnn = AttentionClassifier(VOCAB, encoder="cnn", embedding_dim=8, hidden_dim=4)
    with pytest.raises(ValueError, match=r"no LRP rule for its encoder CNNEncoder.*LSTMEncoder, MLPEncoder"):
        lrp(cnn, sst2_batch)
    with pytest.raises(ProtocolError):
        lrp(nn.Linear(3, 2), sst2_batch)
    lstm = AttentionClassifier(VOCAB, embedding_dim=8, hidden_dim=4)
    with pytest.raises(ValueError, match="out of range"):
        lrp(lstm, sst2_batch, target=5)
    with pytest.raises(ValueError, match="bias_factor"):
        lrp(lstm, sst2_batch, bias_factor=2.0)


def test_encoder_that_breaks_its_rule_is_caught(sst2_batch):
    class ScaledLSTM(LSTMEncoder):
        def forward(self, embeddings, input_mask):
            return 2 * super().forward(embeddings, input_mask)

    model = AttentionClassifier(VOCAB, embedding_dim=8, hidden_dim=4)
    model.encoder = ScaledLSTM(8, 4)
    with pytest.raises(RuntimeError, match="disagrees with the model's own hidden states"):
        lrp(model, sst2_batch)


def test_attribute_verb_dispatches_to_lrp(trained_model, sst2_batch):
    from lightning_xai.attribution.core import ATTRIBUTION_METHODS, attribute

    scores, delta = attribute(
        trained_model, sst2_batch, method="lrp", target=1, bias_factor=1.0, return_convergence_delta=True
    )
    assert "lrp" in ATTRIBUTION_METHODS
    expected = lrp(trained_model, sst2_batch, target=1, bias_factor=1.0)
    torch.testing.assert_close(scores, expected)
    assert delta.shape == (sst2_batch["input_ids"].shape[0],)
    with pytest.raises(TypeError, match="unknown option"):
        attribute(trained_model, sst2_batch, method="lrp", epsilon=0.1)

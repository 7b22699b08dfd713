"""The (Bi)LSTM deletion fast path against nn.LSTM run on the shortened rows, and its use by leave-one-out."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lightning_xai.attribution import attribute
from lightning_xai.models import AttentionClassifier
from lightning_xai.models.encoders import LSTMEncoder
from lightning_xai.models.lstm_unrolled import (
    deleted_hidden,
    deletion_reruns,
    lstm_states,
    supports_unrolling,
    unrolled_lstm,
)


def _packed(rnn: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    out, _ = rnn(packed)
    return pad_packed_sequence(out, batch_first=True, total_length=width)[0]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_states_and_every_deletion_equal_nn_lstm_on_the_shortened_rows(bidirectional):
    torch.manual_seed(0)
    rnn = nn.LSTM(6, 5, batch_first=True, bidirectional=bidirectional).double()
    B, T = 7, 9
    x = torch.randn(B, T, 6, dtype=torch.float64)
    lengths = torch.tensor([9, 2, 5, 1, 8, 3, 9])
    states = lstm_states(rnn, x, lengths)
    full = _packed(rnn, x, lengths, T)
    H = rnn.hidden_size
    torch.testing.assert_close(states.hidden[0], full[..., :H], rtol=1e-12, atol=1e-12)
    if bidirectional:
        torch.testing.assert_close(states.hidden[1], full[..., H:], rtol=1e-12, atol=1e-12)
    # every deletion of every row with at least two positions (first, middle and last ones included)
    rows = torch.tensor([b for b in range(B) for _ in range(int(lengths[b])) if lengths[b] > 1])
    positions = torch.tensor([i for b in range(B) for i in range(int(lengths[b])) if lengths[b] > 1])
    reruns = deletion_reruns(rnn, states, rows, positions)
    fast = deleted_hidden(states, reruns, rows, positions)
    assert fast.shape == (rows.numel(), T - 1, full.shape[-1])
    for k, (b, i) in enumerate(zip(rows.tolist(), positions.tolist())):
        keep = [j for j in range(T) if j != i]
        slow = _packed(rnn, x[b : b + 1, keep], lengths[b : b + 1] - 1, T - 1)[0]
        torch.testing.assert_close(fast[k], slow, rtol=1e-12, atol=1e-12, msg=f"row {b} without position {i}")
    some = torch.tensor([5, 0, 17])
    narrow = deleted_hidden(states, reruns, rows, positions, variants=some, width=8)
    torch.testing.assert_close(narrow, fast[some, :8])


@pytest.mark.parametrize("bidirectional", [True, False])
def test_unrolled_outputs_and_input_gradients_equal_nn_lstm(bidirectional):
    torch.manual_seed(1)
    rnn = nn.LSTM(6, 5, batch_first=True, bidirectional=bidirectional).double()
    lengths = torch.tensor([3, 9, 1, 9, 6])
    x = torch.randn(5, 9, 6, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(5, 9, rnn.hidden_size * (2 if bidirectional else 1), dtype=torch.float64)
    ours = unrolled_lstm(rnn, x, lengths)
    (grad_ours,) = torch.autograd.grad((ours * weights).sum(), x)
    theirs = _packed(rnn, x, lengths, 9)
    (grad_theirs,) = torch.autograd.grad((theirs * weights).sum(), x)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-10, atol=1e-12)
    assert grad_ours[2, 1:].abs().sum() == 0  # pads get no gradient


def test_encoder_unrolls_only_for_explanation_gradients_on_cpu(monkeypatch):
    import lightning_xai.models.encoders as encoders

    calls = []
    monkeypatch.setattr(encoders, "unrolled_lstm", lambda *args: calls.append(1) or unrolled_lstm(*args))
    encoder = LSTMEncoder(4, 3).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    encoder.train()
    trained = encoder(x, mask)  # training: nn.LSTM
    encoder.eval()
    with torch.no_grad():
        inferred = encoder(x, mask)  # inference: nn.LSTM
    assert not calls
    explained = encoder(x.requires_grad_(), mask)  # eval mode with gradients: unrolled
    assert calls == [1]
    torch.testing.assert_close(explained, inferred, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(trained, inferred)  # no dropout inside the encoder


def test_supported_modules():
    assert supports_unrolling(nn.LSTM(3, 2, batch_first=True, bidirectional=True))
    assert not supports_unrolling(nn.LSTM(3, 2, batch_first=True, num_layers=2))
    assert not supports_unrolling(nn.LSTM(3, 2))  # time-major
    assert not supports_unrolling(nn.GRU(3, 2, batch_first=True))


def test_deletion_logits_equal_the_model_on_shortened_real_sentences(trained_model, sst2_batch):
    model = trained_model.eval()
    batch = {k: v[:12] for k, v in sst2_batch.items()}
    rows, positions = batch["mask"].nonzero(as_tuple=True)
    with torch.no_grad():
        fast = model.deletion_logits(model.embed(batch), batch, rows, positions)
        for k in range(0, rows.numel(), 7):
            b, i = int(rows[k]), int(positions[k])
            keep = [j for j in range(batch["mask"].shape[1]) if j != i]
            short = {"input_ids": batch["input_ids"][b : b + 1, keep], "mask": batch["mask"][b : b + 1, keep]}
            torch.testing.assert_close(fast[k], model(short).logits[0], rtol=1e-5, atol=1e-6)


def test_deletion_logits_decline_where_they_would_not_be_the_model(trained_model, sst2_batch):
    batch = {k: v[:4] for k, v in sst2_batch.items()}
    rows, positions = batch["mask"].nonzero(as_tuple=True)
    model = trained_model.eval()
    emb = model.embed(batch)
    assert model.deletion_logits(emb, batch, rows, positions) is None  # gradients enabled
    with torch.no_grad():
        model.train()
        try:
            assert model.deletion_logits(emb, batch, rows, positions) is None  # dropout
        finally:
            model.eval()
        cnn = AttentionClassifier(vocab_size=int(batch["input_ids"].max()) + 1, num_classes=2, encoder="cnn").eval()
        assert cnn.deletion_logits(cnn.embed(batch), batch, rows, positions) is None


def test_leave_one_out_fast_path_equals_rerunning_the_shortened_rows(trained_model, sst2_batch, monkeypatch):
    model = trained_model.eval()
    batch = {k: v[:16] for k, v in sst2_batch.items()}
    fast = attribute(model, batch, "leave_one_out", signed=True)
    monkeypatch.setattr(model, "deletion_logits", lambda *args: None)  # the generic path: re-run every variant
    slow = attribute(model, batch, "leave_one_out", signed=True)
    assert fast.abs().max() > 1e-3
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attention, head_bias", [("tanh", True), ("tanh", False), ("dot", True), ("linear", True)])
def test_deletion_logits_of_every_attention_and_head_equal_the_model_on_the_shortened_rows(
    sst2_batch, attention, head_bias
):
    # the deleted-token variants go through the model's own attention and head, whichever they are
    torch.manual_seed(0)
    batch = {k: v[:6] for k, v in sst2_batch.items()}
    model = AttentionClassifier(
        int(batch["input_ids"].max()) + 1, 3, attention=attention, embedding_dim=12, hidden_dim=5
    ).eval()
    if not head_bias:
        model.classifier = nn.Linear(10, 3, bias=False)
    rows, positions = batch["mask"].nonzero(as_tuple=True)
    with torch.no_grad():
        fast = model.deletion_logits(model.embed(batch), batch, rows, positions)
        for k in range(rows.numel()):
            b, i = int(rows[k]), int(positions[k])
            keep = [j for j in range(batch["mask"].shape[1]) if j != i]
            short = {"input_ids": batch["input_ids"][b : b + 1, keep], "mask": batch["mask"][b : b + 1, keep]}
            torch.testing.assert_close(fast[k], model(short).logits[0], rtol=1e-5, atol=1e-6)

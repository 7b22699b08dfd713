"""Mohankumar's orthogonal LSTM encoder (``encoder="ortho_bilstm"`` / ``"ortho_lstm"``)."""

from __future__ import annotations

import torch

from lightning_xai.models import ENCODERS, AttentionClassifier
from lightning_xai.models.encoders import OrthogonalLSTMEncoder


def test_each_state_is_orthogonal_to_the_mean_of_the_earlier_ones():
    torch.manual_seed(0)
    encoder = OrthogonalLSTMEncoder(6, 5, bidirectional=False).double()
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    h = encoder(x, mask)
    for b in range(2):
        length = int(mask[b].sum())
        for t in range(1, length):
            mean = h[b, :t].mean(0)
            cos = torch.dot(h[b, t], mean) / (h[b, t].norm() * mean.norm())
            assert abs(cos.item()) < 2e-3  # exact up to the 1e-6 in the projection's denominator
        assert (h[b, length:] == 0).all()
    # a hand-rolled loop of the published update over nn.LSTMCell with the same weights
    cell, state, past = encoder.cells[0], None, []
    for t in range(7):
        raw, c = cell(x[:1, t], state)
        if past:
            m = torch.stack(past).mean(0)
            raw = raw - (raw @ m.T) / (m @ m.T + 1e-6) * m
        past.append(raw)
        state = (raw, c)
    assert torch.allclose(h[0], torch.cat(past), atol=1e-12)


def test_pads_do_not_change_real_positions_and_backward_reads_the_reversed_prefix():
    torch.manual_seed(1)
    encoder = OrthogonalLSTMEncoder(4, 3, bidirectional=True)
    x = torch.randn(1, 5, 4)
    short = encoder(x[:, :3], torch.ones(1, 3, dtype=torch.bool))
    padded = encoder(torch.cat([x[:, :3], torch.randn(1, 2, 4)], 1), torch.tensor([[True] * 3 + [False] * 2]))
    assert torch.allclose(short, padded[:, :3], atol=1e-6) and (padded[:, 3:] == 0).all()
    backward = encoder._run(encoder.cells[1], x[:, :3].flip(1), torch.ones(1, 3, dtype=torch.bool)).flip(1)
    assert torch.allclose(short[..., 3:], backward, atol=1e-6)


def test_registered_and_usable_in_the_classifier(sst2_batch, sst2):
    assert {"ortho_lstm", "ortho_bilstm"} <= set(ENCODERS)
    model = AttentionClassifier(sst2.vocab_size, 2, encoder="ortho_bilstm", embedding_dim=8, hidden_dim=4)
    out = model(sst2_batch)
    assert out.hidden_states.shape[-1] == 8 and torch.allclose(out.attention.sum(-1), torch.ones(16))
    out.logits.sum().backward()
    assert model.encoder.cells[0].weight_ih.grad.abs().sum() > 0

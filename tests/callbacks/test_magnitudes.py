"""Issue 30 item 7: AttentionAudit compares attention with |grad×input| (Jain & Wallace's magnitude) by default;
the signed map stays one option away."""

from __future__ import annotations

import torch

from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AttentionAudit
from lightning_xai.callbacks.attention_audit import DEFAULT_METHOD_OPTIONS


def test_grad_x_input_is_compared_as_a_magnitude_unless_asked_signed(kit):
    dm = kit.make_dm(train=64, val=16)
    model = kit.make_model(dm).eval()
    batch = next(iter(dm.val_dataloader()))
    assert DEFAULT_METHOD_OPTIONS == {"grad_x_input": {"absolute": True}}
    generator = torch.Generator().manual_seed(0)
    found, _ = AttentionAudit(methods=("grad_x_input",)).audit_batch(model, batch, generator, list(range(16)))
    signed = attribute(model, batch, "grad_x_input")
    assert (signed < 0).any()  # the signed map has negative tokens, which a magnitude cannot
    torch.testing.assert_close(found.maps["grad_x_input"], signed.abs().float())
    asked, _ = AttentionAudit(
        methods=("grad_x_input",), method_options={"grad_x_input": {"absolute": False}}
    ).audit_batch(model, batch, generator, list(range(16)))
    torch.testing.assert_close(asked.maps["grad_x_input"], signed.float())

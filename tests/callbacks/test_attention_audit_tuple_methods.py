"""AttentionAudit with methods whose ``attribute`` returns a tuple — Integrated Hessians ``(row sums [B, T],
Γ [B, T, T])`` and Integrated Gradients with ``return_convergence_delta=True`` ``(map, delta)`` — compares their
``[B, T]`` maps: the logged agreements equal the metric recomputed by hand on ``attribute(...)[0]``."""

from __future__ import annotations

import torch

from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AttentionAudit
from lightning_xai.data.datamodule import collate
from lightning_xai.metrics.functional.agreement import jensen_shannon

OPTIONS = {
    "integrated_gradients": {"n_steps": 8, "return_convergence_delta": True},
    "integrated_hessians": {"n_steps": 4, "inner_steps": 4},
}


def test_tuple_returning_methods_use_their_token_map(trained_model, sst2):
    batch = collate([sst2.dataset("val")[i] for i in range(4)])
    audit = AttentionAudit(methods=tuple(OPTIONS), metrics=("jsd",), method_options=OPTIONS)
    found, _ = audit.audit_batch(trained_model, batch, torch.Generator(), list(range(4)))
    mask = trained_model.token_mask(batch)
    maps = {name: attribute(trained_model, batch, name, target=None, **opts) for name, opts in OPTIONS.items()}
    assert all(isinstance(m, tuple) for m in maps.values())  # the case under test
    maps = {name: m[0].detach().float() for name, m in maps.items()}
    maps["attention"] = audit.predict(trained_model, batch).attention
    for first, second in audit.pairs:
        expected = jensen_shannon(maps[first], maps[second], mask)
        got = found.values[f"jsd/{first}_vs_{second}"]
        assert got.shape == (4,) and torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)

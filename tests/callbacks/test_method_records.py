"""The audit callbacks ask a method's registry record, not its name (issue 28): a method registered as
precision-sensitive is computed in float32 under autocast, and one registered with pairwise interactions gives the
report its strongest pairs under its own name."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch

from lightning_xai.attribution import ATTRIBUTION_METHODS, PAIRWISE_INTERACTIONS, attribute, register_method
from lightning_xai.callbacks import AttentionAudit
from lightning_xai.data.datamodule import collate


@pytest.fixture()
def autocast_seen():
    seen = {}

    def method(name, **facts):
        @register_method(name, **facts)
        def fn(model, batch, target, *, create_graph=False):
            seen[name] = torch.is_autocast_enabled("cpu")
            return attribute(model, batch, "gradient", target, create_graph=create_graph)

    method("custom_sensitive", precision_sensitive=True)
    method("custom_robust")
    yield seen
    for name in ("custom_sensitive", "custom_robust"):
        ATTRIBUTION_METHODS.pop(name)


def test_a_precision_sensitive_record_runs_in_float32_under_autocast(autocast_seen, trained_model, sst2, tmp_path):
    audit = AttentionAudit(methods=("custom_sensitive", "custom_robust"), metrics=("kendall_tau",), num_samples=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.Trainer(
            precision="bf16-mixed",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp_path),
            callbacks=[audit],
        ).validate(trained_model, sst2, verbose=False)
    assert autocast_seen == {"custom_sensitive": False, "custom_robust": True}
    said = [str(w.message) for w in caught if "reduced precision" in str(w.message)]
    assert len(said) == 1 and "custom_sensitive" in said[0]


def test_pairwise_interactions_of_a_registered_method_reach_the_examples(trained_model, sst2):
    @register_method("outer_attention", resolves_target=True, returns=PAIRWISE_INTERACTIONS)
    def outer(model, batch, target, *, create_graph=False):
        attention = model.forward_from_embeddings(model.embed(batch), batch).attention
        gamma = attention[:, :, None] * attention[:, None, :]
        return gamma.sum(-1), gamma

    try:
        batch = collate([sst2.dataset("val")[i] for i in range(4)])
        audit = AttentionAudit(methods=("outer_attention",), metrics=("jsd",), top_pairs=3)
        found, _ = audit.audit_batch(trained_model, batch, torch.Generator(), list(range(4)))
    finally:
        ATTRIBUTION_METHODS.pop("outer_attention")
    assert found.interaction_method == "outer_attention" and found.interaction_pairs == 3
    attention = audit.predict(trained_model, batch).attention
    torch.testing.assert_close(found.interactions, (attention[:, :, None] * attention[:, None, :]).float())

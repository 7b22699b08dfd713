"""One agreement-metric registry, one aggregation path (the torchmetrics classes) for callbacks and metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AttentionAudit
from lightning_xai.callbacks._audit.aggregation import ValueAggregator
from lightning_xai.callbacks.attention_audit import AGREEMENT_METRICS as CALLBACK_METRICS
from lightning_xai.data import collate
from lightning_xai.metrics import KendallTau, summarize_values
from lightning_xai.metrics.functional import kendall_tau
from lightning_xai.metrics.registry import AGREEMENT_METRICS, register_agreement_metric


def _cosine(preds, target, mask):
    """Cosine similarity of the two maps over the real tokens (a metric no module ships)."""
    a, b = preds.double() * mask, target.double() * mask
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


@pytest.fixture()
def cosine():
    register_agreement_metric("cosine", _cosine, aliases=("cos",))
    yield "cosine"
    AGREEMENT_METRICS.pop("cosine")
    from lightning_xai.metrics.registry import AGREEMENT_ALIASES

    AGREEMENT_ALIASES.pop("cos")


def test_the_old_callback_name_is_the_registry():
    assert CALLBACK_METRICS is AGREEMENT_METRICS
    fn, has_p = AGREEMENT_METRICS["kendall_tau"]  # the (function, p_value) shape of before
    assert fn is kendall_tau and has_p


def test_a_registered_metric_is_computed_and_logged_without_touching_callbacks(kit, tmp_path, cosine):
    dm = kit.make_dm()
    model = kit.make_model(dm)
    audit = AttentionAudit(methods=("gradient",), metrics=("cos", "kendall_tau"), num_samples=16)
    assert audit.metrics == ["cosine", "kendall_tau"]
    kit.make_trainer(tmp_path, [audit]).fit(model, dm)
    logged = audit.history[-1]["metrics"]
    assert "cosine/attention_vs_gradient/significant_fraction" not in logged  # registered without a p-value

    # oracle: the same cosine computed here from the model's own attention and gradient map
    batch = collate([dm.dataset("val")[i] for i in audit.audit_indices(None, "val")])
    model.eval()
    with torch.no_grad():
        attention = model.forward_from_embeddings(model.embed(batch), batch).attention
    gradient = attribute(model, batch, "gradient")
    want = _cosine(attention, gradient, batch["mask"]).numpy()
    assert logged["cosine/attention_vs_gradient/mean"] == pytest.approx(want.mean(), rel=1e-5)
    assert logged["cosine/attention_vs_gradient/std"] == pytest.approx(want.std(), rel=1e-4)


def test_registering_a_taken_name_fails_with_the_fix():
    with pytest.raises(ValueError, match="already registered.*replace=True"):
        register_agreement_metric("jsd", _cosine)
    with pytest.raises(ValueError, match="already registered"):
        register_agreement_metric("new_name", _cosine, aliases=("tau",))
    assert "new_name" not in AGREEMENT_METRICS


def test_callbacks_and_metric_classes_report_the_same_fields_from_the_same_code():
    gen = torch.Generator().manual_seed(0)
    preds, target = torch.rand(30, 9, generator=gen), torch.rand(30, 9, generator=gen)
    mask = torch.ones(30, 9, dtype=torch.bool)
    mask[3, 1:] = False  # one-token text: tau undefined
    tau, p = kendall_tau(preds, target, mask)
    assert math.isnan(tau[3])

    metric = KendallTau()
    metric.update(preds, target, mask)
    from_class = {k: float(v) for k, v in metric.compute().items()}
    from_function = summarize_values(tau.tolist(), p.tolist())
    aggregator = ValueAggregator()
    for rows in (slice(0, 13), slice(13, 30)):  # two batches
        aggregator.update({"tau": tau[rows], "tau/p_value": p[rows]})
    from_callback = aggregator.compute()

    for field in ("mean", "std", "significant_fraction", "count", "undefined_fraction"):
        assert from_function[field] == pytest.approx(from_class[field], rel=1e-12), field
    for field in ("mean", "std", "significant_fraction"):
        assert from_callback[f"tau/{field}"] == pytest.approx(from_class[field], rel=1e-12), field
    ok = ~np.isnan(tau.numpy())
    assert from_class["mean"] == pytest.approx(tau.numpy()[ok].mean())
    assert from_class["std"] == pytest.approx(tau.numpy()[ok].std())
    assert (from_function["count"], from_function["undefined"]) == (29, 1)


def test_a_value_this_process_never_saw_still_takes_part():
    """Under DDP every process computes the same metrics in the same order, also those absent from its shard."""
    aggregator = ValueAggregator()
    aggregator.update({"a": torch.tensor([1.0, 2.0])})
    out = aggregator.compute({"a": False, "b": True})
    assert list(out) == ["a/mean", "a/std", "b/mean", "b/std", "b/significant_fraction"]
    assert out["a/mean"] == 1.5 and math.isnan(out["b/mean"])

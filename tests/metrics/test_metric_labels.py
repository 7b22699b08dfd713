"""Metric labels live with the metric registry (issue 28): a registered metric's label is what the final table and
the report's headline print, with no table of labels in the callbacks or reporting."""

from __future__ import annotations

import pytest

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.metrics.registry import (
    AGREEMENT_ALIASES,
    AGREEMENT_METRICS,
    METRIC_LABELS,
    metric_label,
    register_agreement_metric,
)
from lightning_xai.reporting import headline_sentences


@pytest.fixture()
def cosine():
    register_agreement_metric(
        "cosine", lambda preds, target, mask: (preds * target).sum(-1), aliases=("cos",), label="cosine similarity"
    )
    yield "cosine"
    AGREEMENT_METRICS.pop("cosine")
    AGREEMENT_ALIASES.pop("cos")
    METRIC_LABELS.pop("cosine")


def test_every_built_in_agreement_metric_has_a_label():
    assert {name: metric_label(name) for name in AGREEMENT_METRICS} == {
        "kendall_tau": "Kendall τ",
        "topk_kendall_tau": "top-k Kendall τ",
        "spearman": "Spearman ρ",
        "pearson": "Pearson r",
        "jsd": "JSD",
        "topk_overlap": "top-k overlap",
    }
    assert metric_label("jensen_shannon") == "JSD" and metric_label("not_registered") == "not_registered"


def test_a_registered_label_reaches_the_summary_and_the_headline(cosine):
    audit = AttentionAudit(methods=("gradient",), metrics=("cos",))
    assert audit.summary_rows({"cosine/attention_vs_gradient/mean": 0.5}) == [
        ("cosine similarity attention ↔ gradient", "{cosine/attention_vs_gradient:mean_std}")
    ]
    audit.history = [
        {"stage": "validate", "epoch": 0, "num_examples": 4, "metrics": {"cosine/attention_vs_gradient/mean": 0.5}}
    ]
    sentences = headline_sentences([audit])["agreement"]
    assert any("cosine similarity" in s for s in sentences), sentences


def test_a_label_is_a_non_empty_string():
    with pytest.raises(ValueError, match="label must be a non-empty string"):
        register_agreement_metric("unlabelled", lambda p, t, m: p.sum(-1), label="")
    assert "unlabelled" not in AGREEMENT_METRICS

"""Agreement Metric classes: compute() over several updates equals numpy over the per-instance values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightning_xai.metrics import (
    JensenShannon,
    KendallTau,
    PearsonCorrelation,
    SpearmanCorrelation,
    TopKKendallTau,
    TopKOverlap,
)
from lightning_xai.metrics.functional import (
    jensen_shannon,
    kendall_tau,
    pearson,
    spearman,
    topk_kendall_tau,
    topk_overlap,
)

CASES = [
    (KendallTau, {}, lambda x, y, m: kendall_tau(x, y, m)),
    (TopKKendallTau, {"k": 4}, lambda x, y, m: topk_kendall_tau(x, y, m, k=4)),
    (SpearmanCorrelation, {}, lambda x, y, m: spearman(x, y, m)),
    (PearsonCorrelation, {}, lambda x, y, m: pearson(x, y, m)),
    (JensenShannon, {}, lambda x, y, m: (jensen_shannon(x, y, m), None)),
    (TopKOverlap, {"k": 0.3}, lambda x, y, m: (topk_overlap(x, y, m, k=0.3), None)),
]


def _batches():
    g = torch.Generator().manual_seed(0)
    out = []
    for B, T in ((7, 12), (11, 30), (5, 4)):
        x = torch.randn(B, T, generator=g)
        y = x + 0.8 * torch.randn(B, T, generator=g)
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
        x[0] = 2.0  # a constant map: undefined for the correlations
        y[1] = 0.0  # an all-zero map: undefined for JSD
        out.append((x, y, mask))
    return out


@pytest.mark.parametrize("cls,kwargs,fn", CASES, ids=[c[0].__name__ for c in CASES])
def test_compute_equals_numpy_over_instances(cls, kwargs, fn):
    metric = cls(**kwargs)
    values, pvalues = [], []
    for x, y, mask in _batches():
        metric.update(x, y, mask)
        v, p = fn(x, y, mask)
        values.append(v)
        pvalues.append(p)
    v = torch.cat(values).numpy()
    out = metric.compute()
    defined = ~np.isnan(v)
    assert float(out["mean"]) == pytest.approx(float(np.mean(v[defined])), abs=1e-12)
    assert float(out["std"]) == pytest.approx(float(np.std(v[defined])), abs=1e-9)
    assert float(out["count"]) == defined.sum()
    assert float(out["undefined_fraction"]) == pytest.approx(float(np.mean(~defined)))
    if pvalues[0] is not None:
        p = torch.cat(pvalues).numpy()
        assert float(out["significant_fraction"]) == pytest.approx(float(np.mean(p[defined] <= 0.05)))
        assert 0 < defined.sum() < len(v)  # both kinds of instances are present
    else:
        assert "significant_fraction" not in out
    assert metric.is_differentiable is False and metric.full_state_update is False
    assert all(getattr(metric, name).dtype == torch.float64 for name in ("total", "total_sq", "count"))
    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(float(metric.compute()["mean"]))  # nothing seen: NaN, not a made-up 0


def test_higher_is_better_flags_and_constructor_checks():
    assert KendallTau.higher_is_better and TopKOverlap.higher_is_better
    assert JensenShannon.higher_is_better is False
    with pytest.raises(ValueError, match="variant"):
        KendallTau(variant="x")
    with pytest.raises(ValueError, match="out of range"):
        TopKOverlap(k=0)
    with pytest.raises(ValueError, match="out of range"):
        TopKKendallTau(k=2.5)
    with pytest.raises(ValueError, match="significance"):
        SpearmanCorrelation(significance=1.5)
    with pytest.raises(ValueError, match="eps"):
        JensenShannon(eps=-1.0)


def test_update_rejects_bad_input():
    metric = KendallTau()
    with pytest.raises(ValueError, match="no real token"):
        metric.update(torch.randn(2, 3), torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="NaN or inf"):
        metric.update(torch.tensor([[1.0, float("nan")]]), torch.randn(1, 2), torch.ones(1, 2, dtype=torch.bool))

"""Never a silent wrong number, for every registered agreement metric (property-based, Hypothesis).

For random batches — random lengths and real-token positions, values drawn from a small pool (ties, constant
maps, zero maps) or freely, float32 or float64, NaN/inf at random positions — every metric of
``lightning_xai.metrics.registry.AGREEMENT_METRICS`` either

* equals its scipy/numpy reference on every instance (NaN exactly where the reference is undefined), and its
  torchmetrics class counts those NaN instances in ``undefined_fraction`` and averages the others; or
* raises a ``ValueError`` that names the problem, exactly when the input is invalid: NaN/inf at a real token or
  a row without any real token. NaN/inf at pads never changes a value.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest
import scipy.stats as st
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from scipy.special import rel_entr

from lightning_xai.metrics import (
    JensenShannon,
    KendallTau,
    PearsonCorrelation,
    SpearmanCorrelation,
    TopKKendallTau,
    TopKOverlap,
)
from lightning_xai.metrics.registry import AGREEMENT_METRICS

Ref = Tuple[float, Optional[float]]  # (value, p-value or None)

_POOL = [0.0, 1.0, -1.0, 0.5, 2.0, 1e-3, 3.0]  # few distinct values: ties, constant and all-zero maps


def _top(scores: np.ndarray, k: int) -> set:
    """Positions of the k highest scores, ties broken by the earlier position (the documented rule)."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return set(order[:k])


def _k_size(k, n: int) -> int:
    return min(k, n) if isinstance(k, int) else max(1, math.ceil(n * k - 1e-9))


def _kendall(x: np.ndarray, y: np.ndarray, variant: str = "b", **_) -> Ref:
    res = st.kendalltau(x, y, variant=variant)
    return float(res[0]), float(res[1])


def _topk_kendall(x: np.ndarray, y: np.ndarray, k, mean_length: float, variant: str = "b") -> Ref:
    k = max(10, int(0.1 * mean_length)) if k is None else k
    size = _k_size(k, len(x))
    union = sorted(_top(x, size) | _top(y, size))
    return _kendall(x[union], y[union], variant)


def _spearman(x: np.ndarray, y: np.ndarray, **_) -> Ref:
    res = st.spearmanr(x, y)
    return float(res[0]), float(res[1])


def _pearson(x: np.ndarray, y: np.ndarray, **_) -> Ref:
    if len(x) < 2:
        return math.nan, math.nan  # scipy raises for n < 2; the metric returns NaN (documented)
    res = st.pearsonr(x, y)
    return float(res[0]), float(res[1])


def _jsd(x: np.ndarray, y: np.ndarray, **_) -> Ref:
    p, q = np.abs(x), np.abs(y)
    if p.sum() == 0 or q.sum() == 0:
        return math.nan, None
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2  # not scipy's jensenshannon(p, q) ** 2: its sqrt of a rounding-negative JS gives NaN
    return max(0.0, float(0.5 * rel_entr(p, m).sum() + 0.5 * rel_entr(q, m).sum())), None


def _overlap(x: np.ndarray, y: np.ndarray, k=0.2, **_) -> Ref:
    size = _k_size(k, len(x))
    a, b = _top(x, size), _top(y, size)
    return len(a & b) / len(a | b), None


# registered name -> (numpy/scipy reference, metric class, options tried); every registered metric needs one
REFERENCES: Dict[str, Tuple[Callable[..., Ref], type, List[dict]]] = {
    "kendall_tau": (_kendall, KendallTau, [{}, {"variant": "c"}]),
    "topk_kendall_tau": (_topk_kendall, TopKKendallTau, [{"k": None}, {"k": 2}, {"k": 0.5, "variant": "c"}]),
    "spearman": (_spearman, SpearmanCorrelation, [{}]),
    "pearson": (_pearson, PearsonCorrelation, [{}]),
    "jsd": (_jsd, JensenShannon, [{"eps": 0.0}, {"eps": 1e-10}]),
    "topk_overlap": (_overlap, TopKOverlap, [{"k": 0.2}, {"k": 3}, {"k": 1.0}]),
}


def test_every_registered_metric_has_a_reference():
    assert set(AGREEMENT_METRICS) == set(REFERENCES)
    for name in REFERENCES:
        assert AGREEMENT_METRICS[name].p_value == (
            name in ("kendall_tau", "topk_kendall_tau", "spearman", "pearson")
        ), name


@hs.composite
def _batches(draw):
    """``(preds, target, mask)`` with random shapes, real-token positions, ties, scale and dtype (all finite)."""
    B, T = draw(hs.integers(1, 4)), draw(hs.one_of(hs.integers(1, 14), hs.integers(30, 40)))  # 33: exact p limit
    dtype = draw(hs.sampled_from([torch.float32, torch.float64]))
    mask = torch.tensor(draw(hs.lists(hs.lists(hs.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    for b in range(B):  # at least one real token per row (rows without one are tested separately)
        if not mask[b].any():
            mask[b, draw(hs.integers(0, T - 1))] = True
    value = hs.one_of(hs.sampled_from(_POOL), hs.floats(-100, 100, allow_nan=False, width=32))
    maps = []
    for _ in range(2):
        rows = []
        for _ in range(B):
            kind = draw(hs.sampled_from(["free", "pool", "constant", "zero"]))
            if kind == "constant":
                rows.append([draw(value)] * T)
            elif kind == "zero":
                rows.append([0.0] * T)
            else:
                pick = hs.sampled_from(_POOL) if kind == "pool" else value
                rows.append(draw(hs.lists(pick, min_size=T, max_size=T)))
        scale = draw(hs.sampled_from([1.0, 1e-6, 1e6]))  # tiny and huge maps (attention ~1e-3, IG ~1e3)
        maps.append(torch.tensor(rows, dtype=dtype) * scale)
    return maps[0], maps[1], mask


def _close(ours: float, ref: float, what: str) -> bool:
    if math.isnan(ref):
        return math.isnan(ours)
    tol = 1e-9 if what == "value" else 1e-9 + 1e-6 * abs(ref)  # p-values: t / normal tails, relative
    return abs(ours - ref) <= tol


def _check_metric(name: str, options: dict, preds: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> None:
    reference, cls, _ = REFERENCES[name]
    entry = AGREEMENT_METRICS[name]
    result = entry.function(preds, target, mask, **options)
    values, p_values = result if entry.p_value else (result, None)
    assert values.shape == (preds.shape[0],)
    mean_length = float(mask.sum(1).double().mean())
    expected = []
    for b in range(preds.shape[0]):
        x, y = preds[b][mask[b]].double().numpy(), target[b][mask[b]].double().numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy's ConstantInputWarning etc.
            ref_value, ref_p = reference(x, y, mean_length=mean_length, **options)
        expected.append(ref_value)
        tol_value = 1e-8 if name == "jsd" and options.get("eps", 1e-10) > 0 else None  # J&W's eps vs exact JSD
        ours = float(values[b])
        if tol_value is not None and not math.isnan(ref_value):
            assert abs(ours - ref_value) <= tol_value, (name, options, b, ours, ref_value)
        else:
            assert _close(ours, ref_value, "value"), (name, options, b, x, y, ours, ref_value)
        if p_values is not None:
            assert _close(float(p_values[b]), ref_p, "p"), (name, options, b, x, y, float(p_values[b]), ref_p)

    # the torchmetrics class: NaN instances are counted as undefined, the others averaged
    metric = cls(**options)
    metric.update(preds, target, mask)
    out = metric.compute()
    undefined = sum(math.isnan(v) for v in expected)
    assert float(out["undefined_fraction"]) == pytest.approx(undefined / len(expected), abs=1e-12)
    assert int(out["count"]) == len(expected) - undefined
    defined = [v for v in expected if not math.isnan(v)]
    if defined:
        assert float(out["mean"]) == pytest.approx(float(np.mean(defined)), abs=1e-8)
    else:
        assert math.isnan(float(out["mean"]))


_CASES = [(name, options) for name, (_, _, tried) in REFERENCES.items() for options in tried]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches(), hs.sampled_from(_CASES))
def test_property_every_metric_equals_its_reference_or_nan_counted_undefined(batch, case):
    preds, target, mask = batch
    _check_metric(case[0], case[1], preds, target, mask)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches(), hs.sampled_from(_CASES), hs.sampled_from([math.nan, math.inf, -math.inf]), hs.data())
def test_property_nan_at_pads_is_ignored_and_at_real_tokens_is_a_clear_error(batch, case, bad, data):
    preds, target, mask = batch
    name, options = case
    which = data.draw(hs.sampled_from(["preds", "target"]))
    b = data.draw(hs.integers(0, preds.shape[0] - 1))
    t = data.draw(hs.integers(0, preds.shape[1] - 1))
    maps = {"preds": preds.clone(), "target": target.clone()}
    maps[which][b, t] = bad
    fn = AGREEMENT_METRICS[name].function
    if bool(mask[b, t]):
        with pytest.raises(ValueError, match=rf"{which} has NaN or inf at real tokens of rows \[{b}\]"):
            fn(maps["preds"], maps["target"], mask, **options)
        with pytest.raises(ValueError, match="NaN or inf"):
            REFERENCES[name][1](**options).update(maps["preds"], maps["target"], mask)
    else:
        clean = fn(preds, target, mask, **options)
        dirty = fn(maps["preds"], maps["target"], mask, **options)
        for a, c in zip(
            clean if isinstance(clean, tuple) else (clean,), dirty if isinstance(dirty, tuple) else (dirty,)
        ):
            assert torch.equal(a.isnan(), c.isnan()) and torch.equal(a.nan_to_num(), c.nan_to_num()), name


@settings(max_examples=30, deadline=None)
@given(_batches(), hs.sampled_from(_CASES), hs.data())
def test_property_a_row_without_real_tokens_is_a_clear_error(batch, case, data):
    preds, target, mask = batch
    b = data.draw(hs.integers(0, preds.shape[0] - 1))
    mask = mask.clone()
    mask[b] = False
    with pytest.raises(ValueError, match=rf"rows \[{b}\] have no real token"):
        AGREEMENT_METRICS[case[0]].function(preds, target, mask, **case[1])

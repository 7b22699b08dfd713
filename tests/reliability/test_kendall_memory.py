"""Kendall's τ in O(T) memory (issue 29, "bounded memory").

Before, ``kendall_tau`` built the pairwise signs of every pair of tokens: blocks of ``[rows, 2, T/2, T]``
floats, 4.3 GiB at T = 10,000 and an 80 GB buffer refused at T = 100,000. Now it is Knight's algorithm (sorts and
a merge-sort inversion count): every tensor it makes holds a small multiple of the padded ``B × T`` elements.
These tests record the size of every tensor the call produces (a dispatch mode, not a timing or an RSS figure)
and check the values against scipy on ties and masks; the peak-memory and time figures at T = 1,000 … 100,000
are a benchmark (benchmarks/bench_kendall_memory.py).
"""

from __future__ import annotations

import math
import warnings
from unittest import mock

import numpy as np
import pytest
import scipy.stats as st
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from torch.utils._python_dispatch import TorchDispatchMode

import lightning_xai.metrics.functional.agreement as agreement
from lightning_xai.metrics.functional import kendall_tau, topk_kendall_tau


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.numel())
        return out


def _pair(B: int, T: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, generator=g, dtype=torch.float64)
    y = (0.5 * x + torch.randn(B, T, generator=g, dtype=torch.float64)).round(decimals=1)  # ties in y
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    return x, y, torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)


@pytest.mark.parametrize("fn", [kendall_tau, topk_kendall_tau], ids=lambda f: f.__name__)
def test_every_tensor_is_linear_in_the_tokens(fn):
    B, T = 2, 3000
    x, y, mask = _pair(B, T, seed=0)
    with _LargestTensor() as mode:
        tau, p = fn(x, y, mask)
    padded = B * 4096  # T rounded up to a power of two for the merge sort
    assert mode.largest <= 8 * padded, mode.largest  # before: 2 × 1500 × 3001 signs per row (9M elements)
    for b in range(B):  # and still scipy's numbers
        if fn is kendall_tau:
            ref = st.kendalltau(x[b][mask[b]].numpy(), y[b][mask[b]].numpy())
            assert float(tau[b]) == pytest.approx(ref.statistic, abs=1e-12)
            assert float(p[b]) == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


def test_one_hundred_thousand_tokens_equal_scipy():
    """T = 100,000 (the refused 80 GB before) with ties in both maps: scipy's τ-b and p-value."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5000, (1, 100_000), generator=g).double()
    y = (x + torch.randint(0, 20000, (1, 100_000), generator=g)).double().div(7).floor()
    mask = torch.ones(1, 100_000, dtype=torch.bool)
    mask[0, -123:] = False
    tau, p = kendall_tau(x, y, mask)
    ref = st.kendalltau(x[0, :-123].numpy(), y[0, :-123].numpy())
    assert float(tau[0]) == pytest.approx(ref.statistic, abs=1e-12)
    assert float(p[0]) == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


@hs.composite
def _batches(draw):
    B = draw(hs.integers(1, 5))
    T = draw(hs.integers(1, 70))
    pool = draw(hs.sampled_from([None, [0.0, 1.0, 2.0], [-1.0, 0.0, 0.5, 1.0, 3.0, 1e-3]]))
    values = hs.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False) if pool is None else hs.sampled_from(pool)
    x = np.array(draw(hs.lists(values, min_size=B * T, max_size=B * T))).reshape(B, T)
    y = np.array(draw(hs.lists(values, min_size=B * T, max_size=B * T))).reshape(B, T)
    mask = np.array(draw(hs.lists(hs.booleans(), min_size=B * T, max_size=B * T))).reshape(B, T)
    mask[np.arange(B), draw(hs.lists(hs.integers(0, T - 1), min_size=B, max_size=B))] = True  # ≥ 1 real token
    x[~mask] = draw(hs.sampled_from([math.nan, math.inf, -5.0]))  # pads hold anything
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(mask)


def _same(ours: float, ref: float) -> bool:
    if math.isnan(ref):
        return math.isnan(ours)
    return abs(ours - ref) <= 1e-12 or abs(ours - ref) <= 1e-9 * abs(ref)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches(), hs.sampled_from(["b", "c"]))
def test_property_equals_scipy_with_ties_and_masks(batch, variant):
    """Every row at once and one row per block (a block budget of 1 element) give the same values."""
    x, y, mask = batch
    tau, p = kendall_tau(x, y, mask, variant=variant)
    with mock.patch.object(agreement, "_BLOCK_ELEMENTS", 1):
        merged = kendall_tau(x, y, mask, variant=variant)
    assert torch.equal(torch.nan_to_num(merged[0], 9.0), torch.nan_to_num(tau, 9.0))
    assert torch.equal(torch.nan_to_num(merged[1], 9.0), torch.nan_to_num(p, 9.0))
    for b in range(x.shape[0]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = st.kendalltau(x[b][mask[b]].numpy(), y[b][mask[b]].numpy(), variant=variant)
        assert _same(float(tau[b]), ref.statistic), (b, float(tau[b]), ref.statistic)
        assert _same(float(p[b]), ref.pvalue), (b, float(p[b]), ref.pvalue)

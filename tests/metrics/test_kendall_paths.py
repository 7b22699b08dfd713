"""Kendall τ's two kernels give the same values (issue 29, "Kendall τ speed on short rows").

Rows of at most ``_PAIRWISE_MAX_T`` tokens take the pairwise-signs path (``_pair_stats``: the all-pairs approach, in
blocks of rows whose signs fit ``_BLOCK_ELEMENTS``), longer rows Knight's O(T log T) path (``_rank_stats``). Both
compute the same integers (C − D, tied pairs, tie-group statistics), so τ and p must be bit-equal whichever path
runs — checked here on Hypothesis batches with ties, masks and pads holding anything, on float32 and float64 maps and
on one-row blocks; scipy is the oracle of both (tests/metrics/test_agreement.py, tests/reliability/
test_kendall_memory.py). The speed itself is a benchmark (benchmarks/bench_kendall.py).
"""

from __future__ import annotations

import math
import warnings
from unittest import mock

import pytest
import scipy.stats as st
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import lightning_xai.metrics.functional.agreement as agreement
from lightning_xai.metrics.functional import kendall_tau, topk_kendall_tau
from tests.reliability.test_kendall_memory import _batches, _LargestTensor

KNIGHT, PAIRWISE = 0, 10**9  # _PAIRWISE_MAX_T forcing one path


def _both_paths(fn, *args, **kwargs):
    out = {}
    for name, threshold in (("knight", KNIGHT), ("pairwise", PAIRWISE)):
        with mock.patch.object(agreement, "_PAIRWISE_MAX_T", threshold):
            out[name] = fn(*args, **kwargs)
    return out["knight"], out["pairwise"]


def _assert_bit_equal(a, b):
    for x, y in zip(a, b):
        assert torch.equal(torch.nan_to_num(x, 9.0), torch.nan_to_num(y, 9.0)), (x, y)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_batches(), hs.sampled_from(["b", "c"]), hs.booleans())
def test_property_both_paths_give_the_same_values(batch, variant, float32):
    """Ties (values drawn from small pools), random masks, pads holding NaN/inf: the same τ and p from both paths,
    and from the pairwise path in one-row blocks."""
    x, y, mask = batch
    if float32:  # float32 maps: the pairwise signs run in float32
        x, y = x.float(), y.float()
    knight, pairwise = _both_paths(kendall_tau, x, y, mask, variant=variant)
    _assert_bit_equal(knight, pairwise)
    with mock.patch.object(agreement, "_PAIRWISE_MAX_T", PAIRWISE), mock.patch.object(agreement, "_BLOCK_ELEMENTS", 1):
        _assert_bit_equal(kendall_tau(x, y, mask, variant=variant), pairwise)


@pytest.mark.parametrize("case", ["float64_not_float32", "signed_zeros", "huge_values", "constant_and_single"])
def test_edge_values_give_the_same_values_on_both_paths(case):
    g = torch.Generator().manual_seed(3)
    B, T = 6, 40
    x = torch.randn(B, T, generator=g, dtype=torch.float64)
    y = 0.3 * x + torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[:, 0] = True
    if case == "float64_not_float32":  # differences below float32's resolution: the signs need float64
        y = 1.0 + 1e-12 * torch.randint(0, 5, (B, T), generator=g).double()
    elif case == "signed_zeros":  # -0.0 == 0.0 is a tie, as in scipy
        x = torch.where(torch.rand(B, T, generator=g) < 0.5, torch.tensor(-0.0, dtype=torch.float64), x.round())
        y = torch.where(torch.rand(B, T, generator=g) < 0.5, torch.tensor(0.0, dtype=torch.float64), y.round())
    elif case == "huge_values":  # x_i − x_j overflows to ±inf: its sign is still right
        x = x.sign() * 1e308
        y = y * 1e307
    else:
        x[0], mask[1] = 7.0, False  # row 0 constant in x: NaN; row 1 a single real token: NaN
        mask[1, 3] = True
    x[~mask] = float("nan")
    for variant in ("b", "c"):
        knight, pairwise = _both_paths(kendall_tau, x, y, mask, variant=variant)
        _assert_bit_equal(knight, pairwise)
        for b in range(B):  # and scipy's τ
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ref = st.kendalltau(x[b][mask[b]].numpy(), y[b][mask[b]].numpy(), variant=variant)
            got = float(pairwise[0][b])
            assert (math.isnan(got) and math.isnan(ref.statistic)) or got == pytest.approx(ref.statistic, abs=1e-12)


def test_topk_kendall_tau_gives_the_same_values_on_both_paths():
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(32, 90, generator=g) * 4).round()
    y = (x + torch.randn(32, 90, generator=g) * 3).round()
    mask = torch.arange(90).unsqueeze(0) < torch.randint(20, 91, (32, 1), generator=g)
    _assert_bit_equal(*_both_paths(topk_kendall_tau, x, y, mask, k=0.3))


def test_short_rows_take_the_pairwise_path_and_long_rows_knights():
    x, y = torch.randn(3, 50, dtype=torch.float64), torch.randn(3, 50, dtype=torch.float64)
    mask = torch.ones(3, 50, dtype=torch.bool)
    with mock.patch.object(agreement, "_rank_stats", side_effect=AssertionError("Knight's path ran")):
        kendall_tau(x, y, mask)
    long = torch.randn(1, agreement._PAIRWISE_MAX_T + 1, dtype=torch.float64)
    with mock.patch.object(agreement, "_pair_stats", side_effect=AssertionError("the pairwise path ran")):
        kendall_tau(long, long.flip(1), torch.ones_like(long, dtype=torch.bool))


def test_pairwise_blocks_stay_within_the_block_budget():
    """2,000 rows of 100 tokens: the pairwise signs run in blocks of at most _BLOCK_ELEMENTS elements (one block of
    every row would hold ten times that), with ties so that the tie statistics run too."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2000, 100, generator=g, dtype=torch.float64)
    y = (x + torch.randn(2000, 100, generator=g, dtype=torch.float64)).round(decimals=1)
    mask = torch.ones(2000, 100, dtype=torch.bool)
    with _LargestTensor() as mode:
        kendall_tau(x, y, mask)
    assert mode.largest <= agreement._BLOCK_ELEMENTS, mode.largest

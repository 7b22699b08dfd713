"""Agreement metrics per instance over real tokens, against scipy (the oracle) and by hand."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats as st
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from scipy.spatial.distance import jensenshannon
from torch.overrides import TorchFunctionMode

from lightning_xai.metrics.functional import (
    jensen_shannon,
    jw_top_k,
    kendall_tau,
    pearson,
    spearman,
    topk_kendall_tau,
    topk_overlap,
)

ORACLES = {kendall_tau: st.kendalltau, spearman: st.spearmanr, pearson: st.pearsonr}


def _scipy(fn, x: np.ndarray, y: np.ndarray):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fn is pearson and len(x) < 2:
            return math.nan, math.nan  # scipy.pearsonr raises for n < 2; we return NaN (documented)
        res = ORACLES[fn](x, y)
    return float(res[0]), float(res[1])


def _assert_matches_scipy(fn, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, tol: float = 1e-6) -> None:
    value, p = fn(x, y, mask)
    assert value.shape == p.shape == (x.shape[0],)
    for b in range(x.shape[0]):
        xs, ys = x[b][mask[b]].double().numpy(), y[b][mask[b]].double().numpy()
        ref_v, ref_p = _scipy(fn, xs, ys)
        for ours, ref, what in ((float(value[b]), ref_v, "statistic"), (float(p[b]), ref_p, "p-value")):
            if math.isnan(ref):
                assert math.isnan(ours), (fn.__name__, b, what, ours, ref)
            else:
                assert abs(ours - ref) <= tol, (fn.__name__, b, what, ours, ref, len(xs))
                assert abs(ours - ref) <= 1e-9 * max(abs(ref), 1e-300) or abs(ours - ref) <= 1e-12, (
                    fn.__name__,
                    b,
                    what,
                    ours,
                    ref,
                )  # also relatively tight (tiny p-values)


def _ragged(B: int, T: int, seed: int, ties: bool):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, generator=g, dtype=torch.float64)
    y = torch.randn(B, T, generator=g, dtype=torch.float64)
    if ties:
        x, y = torch.round(x * 2), torch.round(y)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    x = x.masked_fill(~mask, 1e6)  # pad contents must not matter
    y = y.masked_fill(~mask, -7.0)
    return x, y, mask


@pytest.mark.parametrize("fn", [kendall_tau, spearman, pearson], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "T,ties", [(12, False), (12, True), (33, False), (34, False), (80, False), (80, True), (300, True)]
)
def test_equals_scipy_per_instance(fn, T, ties):
    """Small n (exact Kendall p-values), n just above 33, large n (asymptotic), with and without ties."""
    x, y, mask = _ragged(40, T, seed=T + 100 * ties, ties=ties)
    _assert_matches_scipy(fn, x, y, mask)


@pytest.mark.parametrize("fn", [kendall_tau, spearman, pearson], ids=lambda f: f.__name__)
def test_float32_maps_match_scipy_on_the_same_values(fn):
    x, y, mask = _ragged(30, 25, seed=7, ties=False)
    x, y = x.float(), y.float()
    _assert_matches_scipy(fn, x, y, mask)


def test_kendall_exact_p_values_for_extreme_and_near_extreme_orders_beyond_33_tokens():
    """scipy uses the exact distribution also for n > 33 when min(concordant, discordant) <= 1."""
    n = 40
    a = torch.arange(n, dtype=torch.float64)
    swapped = a.clone()
    swapped[[5, 6]] = swapped[[6, 5]]  # exactly one discordant pair
    x = torch.stack([a, a, a, a])
    y = torch.stack([a, -a, swapped, torch.randperm(n, generator=torch.Generator().manual_seed(0)).double()])
    mask = torch.ones(4, n, dtype=torch.bool)
    _assert_matches_scipy(kendall_tau, x, y, mask)
    tau, p = kendall_tau(x, y, mask)
    assert tau[0] == 1 and tau[1] == -1 and 0 < p[2] < 1e-40


@pytest.mark.parametrize("variant", ["b", "c"])
def test_kendall_kernel_row_blocks_and_ties_in_some_blocks_only(monkeypatch, variant):
    """Rows are processed in blocks (some with ties, some without). Splitting into blocks of 7 rows must give
    scipy's values, bit-equal to one block."""
    import lightning_xai.metrics.functional.agreement as agreement

    x, y, mask = _ragged(40, 30, seed=21, ties=False)
    tied_x, tied_y, _ = _ragged(40, 30, seed=22, ties=True)
    x[10:14], y[10:14] = tied_x[10:14], tied_y[10:14]  # ties only in the second block of 7 rows
    whole = kendall_tau(x, y, mask, variant=variant)
    monkeypatch.setattr(agreement, "_BLOCK_ELEMENTS", 7 * 32)  # T = 30 padded to 32: 7 rows per block
    blocked = kendall_tau(x, y, mask, variant=variant)
    for ours, one in zip(blocked, whole):
        assert torch.equal(torch.nan_to_num(ours, 9.0), torch.nan_to_num(one, 9.0))
    for b in range(40):
        ref = st.kendalltau(x[b][mask[b]].numpy(), y[b][mask[b]].numpy(), variant=variant)
        for ours, want in ((float(blocked[0][b]), ref.statistic), (float(blocked[1][b]), ref.pvalue)):
            assert (math.isnan(ours) and math.isnan(want)) or abs(ours - want) <= 1e-12, (b, ours, want)


def test_kendall_values_float32_cannot_separate_are_not_ties():
    """Signs are computed in float32 only when it holds every value exactly; 1 and 1 + 1e-12 stay distinct."""
    x = torch.tensor([[1.0, 1.0 + 1e-12, 1.0 + 2e-12, -0.0, 0.0, 3.0]], dtype=torch.float64)
    y = torch.tensor([[0.1, 0.2, 0.3, 0.0, 0.4, 0.5]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, True, False]])
    tau, p = kendall_tau(x, y, mask)
    ref = st.kendalltau(x[0, :5].numpy(), y[0, :5].numpy())  # -0.0 == 0.0: one tie, as in scipy
    assert float(tau[0]) == pytest.approx(ref.statistic, abs=1e-12)
    assert float(p[0]) == pytest.approx(ref.pvalue, abs=1e-12)
    assert float(kendall_tau(x.float(), y, mask)[0][0]) != pytest.approx(ref.statistic)  # float32 ties the 1s


def test_kendall_tau_c_matches_scipy():
    x, y, mask = _ragged(25, 20, seed=3, ties=True)
    tau, p = kendall_tau(x, y, mask, variant="c")
    for b in range(25):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = st.kendalltau(x[b][mask[b]].numpy(), y[b][mask[b]].numpy(), variant="c")
        if math.isnan(ref[0]):
            assert math.isnan(tau[b])
        else:
            assert abs(float(tau[b]) - ref[0]) < 1e-12 and abs(float(p[b]) - ref[1]) < 1e-12


def test_documented_conventions_constant_maps_and_short_instances():
    """Constant map or one real token -> NaN (scipy's NaN); two tokens -> ±1 with scipy's p-values."""
    x = torch.tensor(
        [[1.0, 1.0, 1.0, 0.0], [1.0, 2.0, 3.0, 0.0], [5.0, 0.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0], [1.0, 2.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    y = torch.tensor(
        [[1.0, 2.0, 3.0, 9.0], [4.0, 4.0, 4.0, 9.0], [2.0, 0.0, 0.0, 0.0], [3.0, 1.0, 0.0, 0.0], [3.0, 3.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    for fn in (kendall_tau, spearman, pearson):
        value, p = fn(x, y, mask)
        assert torch.isnan(value[:3]).all() and torch.isnan(p[:3]).all(), fn.__name__
        assert value[3] == pytest.approx(-1.0) and torch.isnan(value[4]) and torch.isnan(p[4])
        _assert_matches_scipy(fn, x, y, mask)
    assert float(kendall_tau(x, y, mask)[1][3]) == 1.0  # scipy: exact p for n = 2 is 1
    assert float(pearson(x, y, mask)[1][3]) == 1.0
    assert math.isnan(float(spearman(x, y, mask)[1][3]))  # scipy: t-test with 0 degrees of freedom


class _CountCalls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "fn", [kendall_tau, spearman, pearson, jensen_shannon, topk_overlap, topk_kendall_tau], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("T", [20, 300])
def test_vectorised_by_design_the_number_of_torch_calls_does_not_grow_with_the_batch(fn, T):
    counts = []
    x3, y3, mask3 = _ragged(3, T, seed=0, ties=False)
    for repeats in (1, 20):  # the same 3 instances, then 60: iterative p-values converge identically
        x, y, mask = x3.repeat(repeats, 1), y3.repeat(repeats, 1), mask3.repeat(repeats, 1)
        with _CountCalls() as mode:
            fn(x, y, mask)
        counts.append(mode.calls)
    assert counts[0] == counts[1], counts


def test_jensen_shannon_matches_scipy_and_j_and_w_eps():
    x, y, mask = _ragged(40, 30, seed=5, ties=False)
    jsd, exact = jensen_shannon(x, y, mask), jensen_shannon(x, y, mask, eps=0.0)
    for b in range(40):
        p, q = x[b][mask[b]].abs().numpy(), y[b][mask[b]].abs().numpy()
        ref = jensenshannon(p / p.sum(), q / q.sum()) ** 2  # base e
        assert abs(float(exact[b]) - ref) < 1e-12
        assert abs(float(jsd[b]) - ref) < 1e-8  # J&W's eps = 1e-10 inside the logs
    disjoint = jensen_shannon(
        torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]]), torch.ones(1, 2, dtype=torch.bool)
    )
    assert float(disjoint) == pytest.approx(math.log(2), abs=1e-8)


def test_jensen_shannon_of_an_all_zero_map_is_nan():
    out = jensen_shannon(
        torch.tensor([[0.0, 0.0], [1.0, 0.0]]),
        torch.tensor([[1.0, 2.0], [1.0, 2.0]]),
        torch.ones(2, 2, dtype=torch.bool),
    )
    assert math.isnan(out[0]) and not math.isnan(out[1])


def test_topk_overlap_by_hand():
    a = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0], [1.0, 2.0, 3.0, 4.0, 0.0, 0.0]])
    b = torch.tensor([[5.0, 0.0, 3.0, 4.0, 1.0, 9.0], [4.0, 3.0, 2.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    # row 0, k=2: {0, 1} vs {0, 3} -> 1/3; row 1: {3, 2} vs {0, 1} -> 0
    assert topk_overlap(a, b, mask, k=2).tolist() == pytest.approx([1 / 3, 0.0])
    # fraction 0.5: ceil(2.5) = 3 tokens in row 0 ({0,1,2} vs {0,2,3}: 2/4), 2 in row 1
    assert topk_overlap(a, b, mask, k=0.5).tolist() == pytest.approx([0.5, 0.0])
    assert topk_overlap(a, b, mask, k=100).tolist() == [1.0, 1.0]  # k capped at the length: all tokens


def test_topk_kendall_tau_is_scipy_tau_over_the_union_of_top_k_sets():
    x, y, mask = _ragged(30, 40, seed=11, ties=False)
    tau, p = topk_kendall_tau(x, y, mask, k=5)
    for b in range(30):
        xs, ys = x[b][mask[b]], y[b][mask[b]]
        k = min(5, len(xs))
        union = sorted(set(torch.topk(xs, k).indices.tolist()) | set(torch.topk(ys, k).indices.tolist()))
        ref = _scipy(kendall_tau, xs[union].numpy(), ys[union].numpy())
        if math.isnan(ref[0]):
            assert math.isnan(tau[b])
        else:
            assert abs(float(tau[b]) - ref[0]) < 1e-12 and abs(float(p[b]) - ref[1]) < 1e-12


def test_jain_wallace_default_k():
    assert jw_top_k(torch.ones(4, 30, dtype=torch.bool)) == 10
    assert jw_top_k(torch.ones(4, 250, dtype=torch.bool)) == 25
    x, y, mask = _ragged(8, 300, seed=2, ties=False)
    assert torch.equal(
        topk_kendall_tau(x, y, mask)[0].nan_to_num(9), topk_kendall_tau(x, y, mask, k=jw_top_k(mask))[0].nan_to_num(9)
    )


# --- properties -------------------------------------------------------------------------------------------
_values = hs.lists(hs.floats(-1e3, 1e3, allow_nan=False, allow_subnormal=False), min_size=3, max_size=40)


@settings(max_examples=60, deadline=None)
@given(_values)
def test_property_tau_of_a_map_with_itself_is_one_and_with_its_negation_minus_one(values):
    x = torch.tensor([values], dtype=torch.float64)
    mask = torch.ones_like(x, dtype=torch.bool)
    tau_same, _ = kendall_tau(x, x, mask)
    tau_neg, _ = kendall_tau(x, -x, mask)
    if len(set(values)) == 1:
        assert math.isnan(tau_same) and math.isnan(tau_neg)
    else:
        assert float(tau_same) == pytest.approx(1.0) and float(tau_neg) == pytest.approx(-1.0)


@settings(max_examples=60, deadline=None)
@given(_values, _values)
def test_property_jsd_symmetric_and_at_most_ln2(a, b):
    n = min(len(a), len(b))
    x, y = torch.tensor([a[:n]], dtype=torch.float64), torch.tensor([b[:n]], dtype=torch.float64)
    mask = torch.ones_like(x, dtype=torch.bool)
    ab, ba = jensen_shannon(x, y, mask), jensen_shannon(y, x, mask)
    if math.isnan(ab):
        assert math.isnan(ba) and (x.abs().sum() == 0 or y.abs().sum() == 0)
    else:
        assert float(ab) == pytest.approx(float(ba), abs=1e-12)
        assert 0.0 <= float(ab) <= math.log(2) + 1e-12


@settings(max_examples=40, deadline=None)
@given(_values, hs.integers(1, 10), hs.one_of(hs.floats(-1e6, 1e6), hs.sampled_from([math.nan, math.inf, -math.inf])))
def test_property_invariant_to_pad_contents(values, pads, pad_value):
    n = len(values)
    x = torch.tensor([values + [0.0] * pads], dtype=torch.float64)
    y = torch.tensor([list(reversed(values)) + [0.0] * pads], dtype=torch.float64)
    mask = torch.tensor([[True] * n + [False] * pads])
    x2, y2 = x.clone(), y.clone()
    x2[0, n:], y2[0, n:] = pad_value, -pad_value if not math.isnan(pad_value) else pad_value
    for fn in (kendall_tau, spearman, pearson):
        for first, second in zip(fn(x, y, mask), fn(x2, y2, mask)):
            assert torch.equal(first.nan_to_num(7.0), second.nan_to_num(7.0)), fn.__name__
    assert torch.equal(jensen_shannon(x, y, mask).nan_to_num(7.0), jensen_shannon(x2, y2, mask).nan_to_num(7.0))
    assert torch.equal(topk_overlap(x, y, mask, k=2), topk_overlap(x2, y2, mask, k=2))


# --- bad input --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn", [kendall_tau, topk_kendall_tau, spearman, pearson, jensen_shannon, topk_overlap], ids=lambda f: f.__name__
)
def test_bad_input_gives_clear_errors(fn):
    x = torch.randn(2, 4)
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="same \\[B, T\\] shape"):
        fn(x, torch.randn(2, 5), mask)
    with pytest.raises(ValueError, match="mask has shape"):
        fn(x, x, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="no real token"):
        fn(x, x, torch.tensor([[True] * 4, [False] * 4]))
    with pytest.raises(TypeError, match="bool"):
        fn(x, x, mask.long())
    with pytest.raises(ValueError, match=r"\[B, T\] score map"):
        fn(x[0], x[0], mask[0])
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[1, 2] = bad
        with pytest.raises(ValueError, match="NaN or inf at real tokens of rows \\[1\\]"):
            fn(x, y, mask)
    y = x.clone()
    y[1, 3] = float("nan")  # NaN at a pad is fine
    fn(x, y, torch.tensor([[True] * 4, [True, True, True, False]]))


@pytest.mark.parametrize("k", [0, -1, 0.0, 1.5, float("nan"), True, "3"])
def test_k_out_of_range(k):
    x, mask = torch.randn(1, 5), torch.ones(1, 5, dtype=torch.bool)
    with pytest.raises((ValueError, TypeError), match="k"):
        topk_overlap(x, x, mask, k=k)
    with pytest.raises((ValueError, TypeError), match="k"):
        topk_kendall_tau(x, x, mask, k=k)


def test_unknown_variant():
    x, mask = torch.randn(1, 5), torch.ones(1, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="variant"):
        kendall_tau(x, x, mask, variant="a")

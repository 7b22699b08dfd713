"""Plausibility vs human rationales: sklearn (AUPRC, token P/R/F1) and ERASER's span-IOU definition as oracles."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from sklearn.metrics import average_precision_score, precision_recall_fscore_support

from lightning_xai.metrics import AUPRC, IOUF1, TokenF1
from lightning_xai.metrics.functional import auprc, binarize, iou_f1, token_f1


def _data(B=120, T=25, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 5, (B, T), generator=g).double() / 4  # many ties
    scores[B // 2 :] = torch.rand(B - B // 2, T, generator=g, dtype=torch.float64)
    rationale = torch.rand(B, T, generator=g) < 0.35
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    return scores, rationale, mask


def _eraser_spans(flags):
    spans, i = [], 0
    while i < len(flags):
        if flags[i]:
            j = i
            while j < len(flags) and flags[j]:
                j += 1
            spans.append(set(range(i, j)))
            i = j
        else:
            i += 1
    return spans


def test_auprc_equals_sklearn_average_precision_per_instance():
    scores, rationale, mask = _data()
    ours = auprc(scores, rationale, mask)
    for b in range(scores.shape[0]):
        y, s = rationale[b][mask[b]].numpy(), scores[b][mask[b]].numpy()
        if y.sum() == 0:
            assert math.isnan(ours[b])  # documented: undefined without a positive (sklearn would say 0)
            continue
        assert float(ours[b]) == pytest.approx(average_precision_score(y, s), abs=1e-12)


@pytest.mark.parametrize("cut", [{"k": 3}, {"k": 0.3}, {"threshold": 0.5}, {}])
def test_token_prf_equals_sklearn_per_instance(cut):
    scores, rationale, mask = _data(seed=1)
    p, r, f = token_f1(scores, rationale, mask, **cut)
    pred = binarize(scores, mask, rationale, **cut)
    assert not (pred & ~mask).any()
    for b in range(scores.shape[0]):
        y, yp = rationale[b][mask[b]].numpy(), pred[b][mask[b]].numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = precision_recall_fscore_support(y, yp, average="binary", zero_division=0)[:3]
        assert (float(p[b]), float(r[b]), float(f[b])) == pytest.approx(ref, abs=1e-12)


def test_binarize_rules():
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.5, 7.0]])
    mask = torch.tensor([[True, True, True, True, False]])
    rationale = torch.tensor([[True, True, False, False, False]])
    assert binarize(scores, mask, threshold=0.5).tolist() == [[True, False, True, True, False]]
    assert binarize(scores, mask, k=2).tolist() == [[True, False, True, False, False]]  # tie -> earlier token
    assert binarize(scores, mask, rationale).tolist() == [[True, False, True, False, False]]  # oracle length 2
    with pytest.raises(ValueError, match="not both"):
        binarize(scores, mask, k=2, threshold=0.5)
    with pytest.raises(ValueError, match="pass rationale, k or threshold"):
        binarize(scores, mask)


def test_iou_f1_follows_eraser_span_matching():
    scores, rationale, mask = _data(seed=2)
    ours = iou_f1(scores, rationale, mask, threshold=0.5)
    pred = binarize(scores, mask, threshold=0.5)
    matched_total = pred_total = gold_total = 0
    for b in range(scores.shape[0]):
        P = _eraser_spans(pred[b][mask[b]].tolist())
        G = _eraser_spans(rationale[b][mask[b]].tolist())
        tp = sum(1 for p in P if max([len(p & g) / len(p | g) for g in G] or [0.0]) >= 0.5)
        precision = tp / len(P) if P else 0.0
        recall = tp / len(G) if G else 0.0
        f1 = 0.0 if precision == 0 or recall == 0 else 2 * precision * recall / (precision + recall)
        assert float(ours[b]) == pytest.approx(f1, abs=1e-12)
        matched_total, pred_total, gold_total = matched_total + tp, pred_total + len(P), gold_total + len(G)
    metric = IOUF1(threshold=0.5)
    for start in range(0, scores.shape[0], 50):
        metric.update(scores[start : start + 50], rationale[start : start + 50], mask[start : start + 50])
    micro_p, micro_r = matched_total / pred_total, matched_total / gold_total
    out = metric.compute()
    assert float(out["precision"]) == pytest.approx(micro_p) and float(out["recall"]) == pytest.approx(micro_r)
    assert float(out["f1"]) == pytest.approx(2 * micro_p * micro_r / (micro_p + micro_r))


def test_iou_threshold_boundary():
    # predicted span {0,1}, gold span {0,1,2,3}: IOU exactly 0.5 -> a match (>= 0.5)
    scores = torch.tensor([[1.0, 1.0, 0.0, 0.0, 0.0]])
    rationale = torch.tensor([[True, True, True, True, False]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    assert float(iou_f1(scores, rationale, mask, threshold=0.5)) == pytest.approx(1.0)
    assert float(iou_f1(scores, rationale, mask, threshold=0.5, iou_threshold=0.6)) == 0.0


def test_metric_classes_aggregate_like_the_functional_values():
    scores, rationale, mask = _data(seed=3)
    token, area = TokenF1(k=0.3), AUPRC()
    for start in range(0, scores.shape[0], 40):
        sl = slice(start, start + 40)
        token.update(scores[sl], rationale[sl], mask[sl])
        area.update(scores[sl], rationale[sl], mask[sl])
    p, r, f = token_f1(scores, rationale, mask, k=0.3)
    out = token.compute()
    assert float(out["precision"]) == pytest.approx(float(p.mean()))
    assert float(out["f1"]) == pytest.approx(float(f.mean()))
    values = auprc(scores, rationale, mask)
    defined = values[~torch.isnan(values)]
    res = area.compute()
    assert float(res["mean"]) == pytest.approx(float(defined.mean()))
    assert float(res["std"]) == pytest.approx(float(defined.std(unbiased=False)))
    assert float(res["undefined_fraction"]) == pytest.approx(float(torch.isnan(values).double().mean()))


def test_bad_rationale_input():
    scores, mask = torch.rand(2, 4), torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(TypeError, match="rationale must be a bool"):
        auprc(scores, torch.ones(2, 4), mask)
    with pytest.raises(ValueError, match="rationale has shape"):
        token_f1(scores, torch.ones(2, 3, dtype=torch.bool), mask, k=1)
    with pytest.raises(ValueError, match="iou_threshold"):
        iou_f1(scores, torch.ones(2, 4, dtype=torch.bool), mask, k=1, iou_threshold=0.0)
    with pytest.raises(ValueError, match="not both"):
        TokenF1(k=1, threshold=0.3)

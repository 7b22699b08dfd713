"""ERASER comprehensiveness / sufficiency / AOPC against a direct hand computation on the trained reference model
and real SST-2 sentences, and the Metric classes against the functional values."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_xai.audits.erasure import decision_flip
from lightning_xai.metrics import AOPC, Comprehensiveness, DecisionFlip, Sufficiency
from lightning_xai.metrics.functional import AOPC_BINS, aopc, comprehensiveness, rationale_mask, sufficiency
from lightning_xai.metrics.functional.faithfulness import erasure_scores


def _prob(model, ids, cls=None):
    batch = {"input_ids": torch.tensor([ids]), "mask": torch.ones(1, len(ids), dtype=torch.bool)}
    with torch.no_grad():
        p = model(batch).logits.softmax(-1)[0]
    return p if cls is None else float(p[cls])


def _hand(model, batch, scores, k, i, target=None):
    """Comprehensiveness and sufficiency of row i, deleting tokens from a plain Python list of ids."""
    n = int(batch["mask"][i].sum())
    ids = batch["input_ids"][i, :n].tolist()
    values = scores[i, :n].tolist()
    full = _prob(model, ids)
    cls = int(full.argmax()) if target is None else target
    size = min(k, n) if isinstance(k, int) else max(1, math.ceil(k * n - 1e-9))
    top = sorted(range(n), key=lambda j: (-values[j], j))
    deleted = set(top[: min(size, n - 1)])  # x \ r keeps at least one token
    kept_for_suff = set(top[:size])
    comp_ids = [t for j, t in enumerate(ids) if j not in deleted]
    suff_ids = [t for j, t in enumerate(ids) if j in kept_for_suff]
    return float(full[cls]) - _prob(model, comp_ids, cls), float(full[cls]) - _prob(model, suff_ids, cls)


@pytest.fixture(scope="module")
def saliency(sst2_batch):
    g = torch.Generator().manual_seed(0)
    return torch.randn(sst2_batch["mask"].shape, generator=g).masked_fill(~sst2_batch["mask"], 0.0)


@pytest.mark.parametrize("k", [0.2, 0.5, 1, 3])
def test_comprehensiveness_and_sufficiency_match_the_hand_computation(trained_model, sst2_batch, saliency, k):
    comp = comprehensiveness(trained_model, sst2_batch, saliency, k=k)
    suff = sufficiency(trained_model, sst2_batch, saliency, k=k)
    assert comp.shape == suff.shape == (sst2_batch["mask"].shape[0],)
    for i in range(sst2_batch["mask"].shape[0]):
        hand_comp, hand_suff = _hand(trained_model, sst2_batch, saliency, k, i)
        assert float(comp[i]) == pytest.approx(hand_comp, abs=1e-5), i
        assert float(suff[i]) == pytest.approx(hand_suff, abs=1e-5), i
    assert comp.abs().max() > 1e-3  # the trained model reacts: the comparison is not between zeros


def test_attention_rationale_and_explicit_target(trained_model, sst2_batch):
    with torch.no_grad():
        attention = trained_model(sst2_batch).attention
    comp = comprehensiveness(trained_model, sst2_batch, attention, k=0.2, target=0)
    for i in range(0, sst2_batch["mask"].shape[0], 3):
        assert float(comp[i]) == pytest.approx(
            _hand(trained_model, sst2_batch, attention, 0.2, i, target=0)[0], abs=1e-5
        )


def test_aopc_is_the_mean_over_bins(trained_model, sst2_batch, saliency):
    comp, suff = aopc(trained_model, sst2_batch, saliency)
    per_bin = [
        (
            comprehensiveness(trained_model, sst2_batch, saliency, k=k),
            sufficiency(trained_model, sst2_batch, saliency, k=k),
        )
        for k in AOPC_BINS
    ]
    assert torch.allclose(comp, torch.stack([c for c, _ in per_bin]).mean(0), atol=1e-6)
    assert torch.allclose(suff, torch.stack([s for _, s in per_bin]).mean(0), atol=1e-6)


def test_edge_cases_single_token_and_whole_input(trained_model):
    batch = {
        "input_ids": torch.tensor([[5, 0, 0], [7, 8, 9]]),
        "mask": torch.tensor([[True, False, False], [True, True, True]]),
    }
    scores = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.9, 0.5]])
    # one real token: nothing can be deleted from x \ r and r = x -> exactly 0
    assert float(comprehensiveness(trained_model, batch, scores, k=1.0)[0]) == 0.0
    assert float(sufficiency(trained_model, batch, scores, k=1.0)[0]) == 0.0
    # k = 100%: r = x (sufficiency 0); comprehensiveness deletes all but the lowest-scored token (index 0)
    assert float(sufficiency(trained_model, batch, scores, k=1.0)[1]) == 0.0
    full = _prob(trained_model, [7, 8, 9])
    cls = int(full.argmax())
    expected = float(full[cls]) - _prob(trained_model, [7], cls)
    assert float(comprehensiveness(trained_model, batch, scores, k=1.0)[1]) == pytest.approx(expected, abs=1e-6)
    assert rationale_mask(scores, batch["mask"], 0.01).sum(1).tolist() == [1, 1]  # at least one token


def test_bad_input(trained_model, sst2_batch, saliency):
    with pytest.raises(ValueError, match="shape"):
        comprehensiveness(trained_model, sst2_batch, saliency[:, :-1])
    bad = saliency.clone()
    bad[2, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        sufficiency(trained_model, sst2_batch, bad)
    for k in (0, 1.5, -0.1):
        with pytest.raises(ValueError, match="out of range"):
            comprehensiveness(trained_model, sst2_batch, saliency, k=k)
        with pytest.raises(ValueError, match="out of range"):
            Comprehensiveness(k=k)
    with pytest.raises(ValueError, match="target 3 is out of range"):
        comprehensiveness(trained_model, sst2_batch, saliency, target=3)
    with pytest.raises(ValueError, match="bins is empty"):
        AOPC(bins=())
    with pytest.raises(TypeError, match="ExplainableModel"):
        comprehensiveness(torch.nn.Linear(3, 3), sst2_batch, saliency)


def test_metric_classes_accumulate_over_batches(trained_model, sst2_batch, saliency):
    halves = [slice(0, 8), slice(8, 16)]
    metric_c, metric_s, metric_a = Comprehensiveness(k=0.2), Sufficiency(k=0.2), AOPC()
    flip = DecisionFlip("gradient")
    for sl in halves:
        part = {k: v[sl] for k, v in sst2_batch.items()}
        metric_c.update(trained_model, part, saliency[sl])
        metric_s.update(trained_model, part, saliency[sl])
        metric_a.update(trained_model, part, saliency[sl])
        flip.update(trained_model, part)
    comp = comprehensiveness(trained_model, sst2_batch, saliency, k=0.2)
    suff = sufficiency(trained_model, sst2_batch, saliency, k=0.2)
    out = metric_c.compute()
    assert float(out["mean"]) == pytest.approx(float(comp.mean()), abs=1e-6)
    assert float(out["std"]) == pytest.approx(float(comp.std(unbiased=False)), abs=1e-6)
    assert float(metric_s.compute()["mean"]) == pytest.approx(float(suff.mean()), abs=1e-6)
    a_comp, a_suff = aopc(trained_model, sst2_batch, saliency)
    res = metric_a.compute()
    assert float(res["comprehensiveness"]) == pytest.approx(float(a_comp.mean()), abs=1e-6)
    assert float(res["sufficiency_std"]) == pytest.approx(float(a_suff.std(unbiased=False)), abs=1e-6)
    full = decision_flip(trained_model, sst2_batch, "gradient")
    f = full.flipped
    got = flip.compute()
    assert float(got["flip_rate"]) == pytest.approx(float(f.double().mean()))
    assert float(got["items_mean"]) == pytest.approx(float(full.items_removed[f].double().mean()))
    assert float(got["attention_mass_mean"]) == pytest.approx(
        float(full.attention_removed[f].double().mean()), abs=1e-6
    )
    assert float(got["fraction_mean"]) == pytest.approx(float(full.fraction_removed[f].mean()))
    assert got["count"] == 16
    for metric in (metric_c, metric_s, metric_a, flip):
        assert metric.is_differentiable is False and metric.full_state_update is False
    assert Comprehensiveness.higher_is_better is True and Sufficiency.higher_is_better is False


def test_a_stack_of_maps_gives_each_maps_own_scores_and_scores_a_shared_erasure_once(
    trained_model, sst2_batch, saliency, monkeypatch
):
    import lightning_xai.metrics.functional.erasure as erasure

    with torch.no_grad():
        attention = trained_model(sst2_batch).attention
    maps = torch.stack([saliency, attention, saliency])  # the third map repeats the first: nothing new to score
    ks = [0.2, *AOPC_BINS]  # 0.2 twice, as ErasureAudit asks (its k and its AOPC bin)
    scored = []
    real_take = erasure.gather_rows

    def counting(batch, rows, size):
        scored.append(int(rows.numel()))
        return real_take(batch, rows, size)

    monkeypatch.setattr(erasure, "gather_rows", counting)
    comp, suff = erasure_scores(trained_model, sst2_batch, maps, ks)
    built = scored[0]  # the first gather_rows builds the erased rows to score
    monkeypatch.setattr(erasure, "gather_rows", real_take)
    assert comp.shape == suff.shape == (3, len(ks), sst2_batch["mask"].shape[0])
    for r, one in enumerate(maps):
        alone_comp, alone_suff = erasure_scores(trained_model, sst2_batch, one, ks)
        assert torch.allclose(comp[r], alone_comp, atol=1e-6) and torch.allclose(suff[r], alone_suff, atol=1e-6)
    B = sst2_batch["mask"].shape[0]
    assert built <= 2 * 2 * (len(ks) - 1) * B  # map 3 = map 1 and k = 0.2 twice: at most 2 maps x 5 sizes x 2
    i = 0  # and against deleting tokens by hand
    assert float(comp[1, 0, i]) == pytest.approx(_hand(trained_model, sst2_batch, attention, 0.2, i)[0], abs=1e-5)
    with pytest.raises(ValueError, match="empty stack"):
        erasure_scores(trained_model, sst2_batch, maps[:0], ks)
    # the logits of a pass already made (decision_flip's) stand in for the full pass
    flips = decision_flip(trained_model, sst2_batch, maps[1])
    with torch.no_grad():
        assert torch.allclose(flips.logits, trained_model(sst2_batch).logits, atol=1e-6)
    given = erasure_scores(trained_model, sst2_batch, maps, ks, logits=flips.logits)
    assert torch.allclose(given[0], comp, atol=1e-6) and torch.allclose(given[1], suff, atol=1e-6)
    shifted = erasure_scores(trained_model, sst2_batch, maps, ks, logits=flips.logits + torch.tensor([0.5, -0.5]))
    assert not torch.allclose(shifted[0], comp, atol=1e-3)  # the given logits are the ones used
    with pytest.raises(ValueError, match="rows"):
        erasure_scores(trained_model, sst2_batch, maps, ks, logits=flips.logits[:2])

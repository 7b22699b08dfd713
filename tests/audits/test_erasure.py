"""Erasure interventions on the trained reference model and real SST-2 batches, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from lightning_xai.audits.erasure import (
    RANKINGS,
    attention_gradient,
    decision_flip,
    erase_tokens,
    erasure_probabilities,
    ranking_scores,
)
from lightning_xai.data import collate
from lightning_xai.data.datamodule import EncodedDataset


def _single(batch, i):
    """Row i alone, cut to its own length (a batch of one, no padding)."""
    n = int(batch["mask"][i].sum())
    return {"input_ids": batch["input_ids"][i : i + 1, :n], "mask": torch.ones(1, n, dtype=torch.bool)}


def _hand_flip(model, batch, i, scores):
    """Serrano & Smith by hand for row i: zero items in descending score order, renormalise, re-run."""
    one = _single(batch, i)
    n = one["mask"].shape[1]
    with torch.no_grad():
        out = model(one)
        alpha, decision = out.attention[0], int(out.logits.argmax())
        order = sorted(range(n), key=lambda j: (-float(scores[j]), j))
        for s in range(1, n):
            weights = alpha.clone()
            weights[order[:s]] = 0
            weights = weights / weights.sum()
            if int(model(one, attention_override=weights[None]).logits.argmax()) != decision:
                return s, float(alpha[order[:s]].sum())
    return -1, -1.0


def test_erase_tokens_keeps_special_tokens_and_aligns_every_per_token_tensor(sst2, trained_model):
    examples = sst2.examples("val")[:6]
    items = [
        dict(it, rationale=[i % 3 == 0 for i in range(len(it["input_ids"]))])
        for it in EncodedDataset(examples, sst2.vocab, add_sos_eos=True)
    ]
    batch = collate(items)
    assert "input_mask" in batch  # <sos>/<eos> are read by the encoder but are not real tokens
    mask = batch["mask"]
    remove = mask & (torch.arange(mask.shape[1]).unsqueeze(0) % 2 == 1)
    out = erase_tokens(trained_model, batch, remove)
    for i in range(6):
        ids = batch["input_ids"][i][batch["input_mask"][i]].tolist()
        keep = (~remove[i])[batch["input_mask"][i]].tolist()
        expected = [t for t, k in zip(ids, keep) if k]
        got = out["input_ids"][i][out["input_mask"][i]].tolist()
        assert got == expected
        assert got[0] == sst2.vocab.stoi["<sos>"] and got[-1] == sst2.vocab.stoi["<eos>"]
        kept_real = batch["mask"][i] & ~remove[i]
        assert out["mask"][i].sum() == kept_real.sum()
        assert out["rationale"][i][out["mask"][i]].tolist() == batch["rationale"][i][kept_real].tolist()
    assert out["input_ids"].shape[1] == int(out["input_mask"].sum(1).max())
    assert torch.equal(out["labels"], batch["labels"])


def test_erase_tokens_errors(trained_model, sst2_batch):
    mask = sst2_batch["mask"]
    with pytest.raises(ValueError, match="not real tokens"):
        erase_tokens(trained_model, sst2_batch, ~mask)
    with pytest.raises(ValueError, match="keep at least one token"):
        erase_tokens(trained_model, sst2_batch, mask.clone())
    with pytest.raises(TypeError, match="bool"):
        erase_tokens(trained_model, sst2_batch, mask.long())
    with pytest.raises(ValueError, match="shape"):
        erase_tokens(trained_model, sst2_batch, mask[:, :-1])


def test_erasure_probabilities_match_one_sentence_at_a_time(trained_model, sst2_batch):
    mask = sst2_batch["mask"]
    g = torch.Generator().manual_seed(3)
    removals = [mask & (torch.rand(mask.shape, generator=g) < p) for p in (0.2, 0.6)]
    for r in removals:
        r[:, 0] = False  # keep a token in every row
    target = torch.zeros(mask.shape[0], dtype=torch.long)
    probs = erasure_probabilities(trained_model, sst2_batch, removals, target, max_rows=7)
    assert probs.shape == (2, mask.shape[0])
    for k, r in enumerate(removals):
        for i in range(mask.shape[0]):
            one = _single(sst2_batch, i)
            keep = ~r[i][: one["mask"].shape[1]]
            short = {"input_ids": one["input_ids"][:, keep], "mask": one["mask"][:, keep]}
            with torch.no_grad():
                expected = trained_model(short).logits.softmax(-1)[0, 0]
            assert float(probs[k, i]) == pytest.approx(float(expected), abs=1e-5)


@pytest.mark.parametrize("ranking", ["attention", "random", "gradient", "grad_x_attention"])
def test_decision_flip_matches_the_hand_computation(trained_model, sst2_batch, ranking):
    scores = ranking_scores(trained_model, sst2_batch, ranking, generator=torch.Generator().manual_seed(0))
    result = decision_flip(trained_model, sst2_batch, scores, max_rows=37)
    mask = sst2_batch["mask"]
    flips = 0
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        items, mass = _hand_flip(trained_model, sst2_batch, i, scores[i][:n])
        assert int(result.items_removed[i]) == items, (ranking, i)
        if items == -1:
            assert not result.flipped[i] and result.attention_removed[i] == -1 and result.fraction_removed[i] == -1
        else:
            flips += 1
            assert bool(result.flipped[i])
            assert float(result.attention_removed[i]) == pytest.approx(mass, abs=1e-6)
            assert float(result.fraction_removed[i]) == pytest.approx(items / n)
    assert torch.equal(result.lengths, mask.sum(1))
    if ranking in ("gradient", "grad_x_attention"):
        assert flips > 0  # the hand check is exercised on flipping instances, not only on -1


def test_decision_flip_string_ranking_equals_its_score_map_and_is_chunking_invariant(trained_model, sst2_batch):
    by_name = decision_flip(trained_model, sst2_batch, "gradient")
    by_map = decision_flip(trained_model, sst2_batch, attention_gradient(trained_model, sst2_batch), max_rows=5)
    assert torch.equal(by_name.items_removed, by_map.items_removed)
    one = decision_flip(trained_model, sst2_batch, "random", generator=torch.Generator().manual_seed(4))
    two = decision_flip(trained_model, sst2_batch, "random", generator=torch.Generator().manual_seed(4))
    assert torch.equal(one.items_removed, two.items_removed)  # seeded random ranking is reproducible


class _CountForwards(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.softmax = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.einsum:  # the reference model pools once per forward with einsum
            self.softmax += 1
        return func(*args, **(kwargs or {}))


def test_decision_flip_is_batched_not_a_loop_over_instances_or_steps(trained_model, sst2_batch):
    mask = sst2_batch["mask"]
    steps = mask.sum(1) - 1
    total_steps = int(steps.sum())
    ranges = math.ceil(math.log2(int(steps.max()) + 1))  # steps 1, 2-3, 4-7, ...: at most one pass per range
    with _CountForwards() as mode:
        decision_flip(trained_model, sst2_batch, "attention", max_rows=4096)
    # the full pass, the replay's check (the scorer on every row, a full pass and the scorer on two rows) and the
    # passes over the Σ(n-1) steps of all rows
    assert mode.softmax <= 4 + ranges < total_steps


def test_attention_gradient_equals_autograd_on_one_sentence(trained_model, sst2_batch):
    grad = attention_gradient(trained_model, sst2_batch)
    assert torch.all(grad[~sst2_batch["mask"]] == 0)
    for i in (0, 5):
        one = _single(sst2_batch, i)
        with torch.no_grad():
            out = trained_model(one)
        alpha = out.attention.clone().requires_grad_(True)
        logits = trained_model(one, attention_override=alpha).logits
        logits[0, int(out.logits.argmax())].backward()
        n = one["mask"].shape[1]
        assert torch.allclose(grad[i, :n], alpha.grad[0], atol=1e-6)
    # target given explicitly: the other class's logit
    other = attention_gradient(trained_model, sst2_batch, target=1 - sst2_batch["labels"] * 0)
    assert other.shape == grad.shape


def test_ranking_scores_errors_and_inference_mode(trained_model, sst2_batch):
    with pytest.raises(ValueError, match="Unknown ranking"):
        ranking_scores(trained_model, sst2_batch, "saliency")
    with pytest.raises(ValueError, match="shape"):
        decision_flip(trained_model, sst2_batch, torch.zeros(2, 2))
    bad = torch.rand(sst2_batch["mask"].shape)
    bad[3, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        decision_flip(trained_model, sst2_batch, bad)
    with pytest.raises(ValueError, match="target"):
        attention_gradient(trained_model, sst2_batch, target=7)
    with pytest.raises(ValueError, match="max_rows"):
        decision_flip(trained_model, sst2_batch, "attention", max_rows=0)
    with pytest.raises(TypeError, match="ExplainableModel"):
        decision_flip(torch.nn.Linear(2, 2), sst2_batch)
    trained_model.train()
    try:
        with torch.inference_mode():  # as inside trainer.validate
            batch = {k: v.clone() for k, v in sst2_batch.items()}
            for ranking in RANKINGS:
                decision_flip(trained_model, batch, ranking, generator=torch.Generator().manual_seed(0))
        assert trained_model.training  # modes restored
    finally:
        trained_model.eval()

"""decision_flip's replay fast path gives the results of full passes; a replay that fails its check is not used."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.attribution.override_replay import override_scorer
from lightning_xai.metrics.functional.decision_flips import decision_flip
from lightning_xai.metrics.functional.erasure import attention_gradient, ranking_scores

pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForSequenceClassification  # noqa: E402

from tests.adapters.test_families import DECODERS, ENCODERS, PAD, SIZE, family_batch, family_model  # noqa: E402

FIELDS = ("items_removed", "attention_removed", "fraction_removed", "flipped", "lengths")


class Plain(nn.Module):
    """The model seen through the bare protocol only: no OverrideReplay, no LinearHead (the fallback path)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def embed(self, batch):
        return self.inner.embed(batch)

    def token_mask(self, batch):
        return self.inner.token_mask(batch)

    def forward_from_embeddings(self, embeddings, batch, *, attention_override=None):
        return self.inner.forward_from_embeddings(embeddings, batch, attention_override=attention_override)


def _same(fast, slow):
    for field in FIELDS:
        assert torch.equal(getattr(fast, field), getattr(slow, field)), field


def _hf(name: str) -> HuggingFaceAdapter:
    """A tiny random classifier of the family (fp64, eval), initialised large enough that decisions flip."""
    config = AutoConfig.for_model(
        name,
        **{**SIZE, **ENCODERS.get(name, DECODERS.get(name, {}))},
        num_labels=2,
        pad_token_id=PAD,
        attn_implementation="eager",
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HuggingFaceAdapter(AutoModelForSequenceClassification.from_config(config).double().eval())


def _batch(encoder: bool, left: bool, lengths=(12, 9, 7, 5, 11, 4, 8, 10)):
    """Rows of these lengths ([CLS] ... [SEP] ids 2 and 3 for encoders), padded with PAD on one side."""
    T, g = max(lengths), torch.Generator().manual_seed(1)
    ids = torch.full((len(lengths), T), PAD)
    attention = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        span = slice(T - n, T) if left else slice(0, n)
        ids[row, span] = torch.randint(4, 64, (n,), generator=g)
        attention[row, span] = 1
    mask = attention.bool().clone()
    if encoder:
        for row, n in enumerate(lengths):
            ids[row, 0], ids[row, n - 1] = 2, 3
            mask[row, 0] = mask[row, n - 1] = False
    return {"input_ids": ids, "attention_mask": attention, "mask": mask}


def _uses_replay(model, batch) -> bool:
    with torch.no_grad():
        return override_scorer(model, model.embed(batch), batch)[1] is not None


CASES = [("bert", False), ("distilbert", False), ("llama", True)]


@pytest.mark.parametrize("name,left", CASES, ids=[f"{n}-{'left' if is_left else 'right'}" for n, is_left in CASES])
def test_transformer_replay_gives_the_full_passes_results(name, left):
    adapter = _hf(name)
    batch = _batch(name in ENCODERS, left)
    assert _uses_replay(adapter, batch) and not _uses_replay(Plain(adapter), batch)
    flips = 0
    for ranking in ("attention", "random", "grad_x_attention"):
        scores = ranking_scores(adapter, batch, ranking, generator=torch.Generator().manual_seed(0))
        fast = decision_flip(adapter, batch, scores)
        _same(fast, decision_flip(Plain(adapter), batch, scores))
        _same(fast, decision_flip(Plain(adapter), batch, scores, max_rows=2))
        flips += int(fast.flipped.sum())
    assert flips > 0  # the equality is exercised on flipping instances too


@pytest.mark.parametrize("name", ["bert", "llama", "reference"])
def test_a_stack_of_rankings_gives_each_rankings_own_flips(name, request):
    if name == "reference":
        model, batch = request.getfixturevalue("trained_model"), request.getfixturevalue("sst2_batch")
    else:
        model, batch = _hf(name), _batch(name in ENCODERS, name == "llama")
    maps = torch.stack(
        [
            ranking_scores(model, batch, r, generator=torch.Generator().manual_seed(2)).float()
            for r in ("attention", "random", "grad_x_attention")
        ]
    ).to(model.embed(batch).dtype)
    stacked = decision_flip(model, batch, maps)
    assert stacked.flipped.shape == (3, batch["input_ids"].shape[0])
    for r, one in enumerate(maps):
        alone = decision_flip(model, batch, one)
        for field in FIELDS:
            assert torch.equal(getattr(stacked, field)[r], getattr(alone, field)), (r, field)
    _same(decision_flip(Plain(model), batch, maps, max_rows=3), stacked)  # the fallback passes agree too
    assert bool(stacked.flipped.any())
    # names are read from the flips' own pass; the gradient rankings back-propagate through the replay only
    names = ["attention", "gradient", "grad_x_attention", maps[1]]
    listed = decision_flip(model, batch, names)
    assert _uses_replay(model, batch)
    for r, name in enumerate(names):  # against the rankings of full passes (the bare protocol has no replay)
        full = name if isinstance(name, torch.Tensor) else ranking_scores(Plain(model), batch, name)
        mask = model.token_mask(batch)
        assert torch.allclose(
            listed.scores[r].masked_fill(~mask, 0),
            full.to(listed.scores.dtype).masked_fill(~mask, 0),
            rtol=1e-4,
            atol=1e-6 * float(full.abs().max()),
        ), r
        alone = decision_flip(model, batch, full)
        assert torch.equal(listed.flipped[r], alone.flipped) and torch.equal(
            listed.items_removed[r], alone.items_removed
        ), r
    with pytest.raises(ValueError, match="empty stack"):
        decision_flip(model, batch, maps[:0])


def test_replay_inside_inference_mode():
    adapter = _hf("bert")
    batch = _batch(True, False)
    expected = decision_flip(adapter, batch, ["attention", "gradient"])
    adapter.train()
    with torch.inference_mode():  # as inside trainer.validate: the gradient ranking back-propagates all the same
        inside = decision_flip(adapter, {k: v.clone() for k, v in batch.items()}, ["attention", "gradient"])
    assert adapter.training  # modes restored
    _same(inside, expected)
    assert torch.equal(inside.scores, expected.scores) and bool(inside.scores[1].abs().sum() > 0)


def test_reference_model_linear_head_replay_gives_the_full_passes_results(trained_model, sst2_batch):
    assert _uses_replay(trained_model, sst2_batch)
    flips = 0
    for ranking in ("attention", "random", "gradient"):
        scores = ranking_scores(trained_model, sst2_batch, ranking, generator=torch.Generator().manual_seed(1))
        fast = decision_flip(trained_model, sst2_batch, scores)
        _same(fast, decision_flip(Plain(trained_model), sst2_batch, scores, max_rows=7))
        flips += int(fast.flipped.sum())
    assert flips > 0


class Skewed(HuggingFaceAdapter):
    """A replay that is wrong: with an override (``always``: also without), row 0's logits are shifted."""

    always = False

    def override_replay(self, embeddings, batch):
        out, scorer = super().override_replay(embeddings, batch)
        self.calls = 0

        def wrong(rows, override):
            self.calls += 1
            logits = scorer(rows, override).clone()
            if override is not None or self.always:
                logits[rows == 0] += 1e-3
            return logits

        return out, wrong


@pytest.mark.parametrize("always", [False, True])
def test_a_replay_that_fails_its_check_is_not_used(always):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skewed = Skewed(family_model("bert"))
    skewed.always = always
    batch = family_batch("bert", False)
    with torch.no_grad():
        out, scorer = override_scorer(skewed, skewed.embed(batch), batch)
    assert scorer is None and out.logits.shape == (3, 2)
    scores = ranking_scores(skewed, batch, "random", generator=torch.Generator().manual_seed(0))
    result = decision_flip(skewed, batch, scores)
    assert skewed.calls == (1 if always else 2)  # the check only, no step scored by the wrong replay
    _same(result, decision_flip(Plain(skewed), batch, scores))


def test_fallback_passes_are_as_wide_as_their_longest_row(trained_model, sst2_batch):
    widths = []

    class Recording(Plain):
        def forward_from_embeddings(self, embeddings, batch, *, attention_override=None):
            widths.append(embeddings.shape[1])
            return super().forward_from_embeddings(embeddings, batch, attention_override=attention_override)

    T = sst2_batch["mask"].shape[1]
    wide = {
        k: torch.cat([v, torch.zeros_like(v[:, :5])], 1) if k in ("input_ids", "mask") else v
        for k, v in sst2_batch.items()
    }  # five more pad columns
    scores = ranking_scores(trained_model, sst2_batch, "random", generator=torch.Generator().manual_seed(2))
    padded = torch.cat([scores, torch.zeros(scores.shape[0], 5)], 1)
    _same(
        decision_flip(Recording(trained_model), wide, padded, max_rows=4),
        decision_flip(trained_model, sst2_batch, scores),
    )
    # the full pass, then padding_trimmer's check (the same rows at full width and trimmed), then the steps
    assert widths[0] == widths[1] == T + 5 and max(widths[3:]) <= T and min(widths[3:]) < T


def test_an_instance_that_flips_at_step_f_costs_fewer_than_2f_rows():
    seen = []

    class Recording(Plain):
        def forward_from_embeddings(self, embeddings, batch, *, attention_override=None):
            if attention_override is not None:
                seen.append(batch["row_id"])
            return super().forward_from_embeddings(embeddings, batch, attention_override=attention_override)

    adapter = _hf("bert")
    batch = _batch(True, False, lengths=(12, 9, 7, 5, 11, 4, 8, 10, 14, 13, 12, 11))
    B = batch["mask"].shape[0]
    scores = ranking_scores(adapter, batch, "grad_x_attention")
    result = decision_flip(Recording(adapter), {**batch, "row_id": torch.arange(B)}, scores)
    _same(result, decision_flip(adapter, batch, scores))
    rows = torch.bincount(torch.cat(seen), minlength=B)
    steps = result.lengths - 1
    flipped = result.flipped
    assert bool((result.items_removed[flipped] < steps[flipped] / 2).any())  # some instances flip early
    assert torch.all(rows[flipped] <= 2 * result.items_removed[flipped] - 1)  # passes reach steps 1, 2-3, 4-7, ...
    assert torch.equal(rows[~flipped], steps[~flipped])  # every step of an instance that never flips
    assert int(rows.sum()) < int(steps.sum())


@pytest.mark.parametrize("name", ["bert", "distilbert", "llama", "reference"])
def test_attention_gradient_through_the_replay_is_the_full_passes_gradient(name, request):
    if name == "reference":
        model, batch = request.getfixturevalue("trained_model"), request.getfixturevalue("sst2_batch")
    else:
        model, batch = _hf(name), _batch(name in ENCODERS, name == "llama")
    assert _uses_replay(model, batch)
    for target in (None, 1):
        fast, full = (
            attention_gradient(model, batch, target=target),
            attention_gradient(Plain(model), batch, target=target),
        )
        scale = float(full.abs().max())
        assert scale > 0 and torch.allclose(fast, full, rtol=1e-5, atol=1e-6 * scale), (fast - full).abs().max()


def _recording(calls):
    """A stand-in for ``override_scorer`` whose scorer records the rows of every call (and packs as the real one)."""
    import lightning_xai.metrics.functional.decision_flips as flips

    real = flips.override_scorer

    class Recorded:
        def __init__(self, scorer):
            self.scorer, self.packs_rows = scorer, getattr(scorer, "packs_rows", False)

        def __call__(self, rows, override):
            calls.append(rows.clone())
            return self.scorer(rows, override)

    def recording(model, embeddings, batch):
        out, scorer = real(model, embeddings, batch)
        return out, None if scorer is None else Recorded(scorer)

    return recording


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_a_packing_scorer_gets_every_step_of_an_instance_in_one_call(name, monkeypatch):
    """A packing scorer lays a row out once per call, so decision flip gives it every step of an instance in the same
    call, instance after instance (the doubling passes recomputed each row about log₂ n times): the same flips."""
    import lightning_xai.metrics.functional.decision_flips as flips
    from lightning_xai.adapters.capabilities import packs_overrides

    adapter = _hf(name)
    batch = _batch(name in ENCODERS, name == "llama")
    with torch.no_grad():
        assert packs_overrides(override_scorer(adapter, adapter.embed(batch), batch)[1])
    maps = torch.stack(
        [
            ranking_scores(adapter, batch, r, generator=torch.Generator().manual_seed(2))
            for r in ("attention", "random", "grad_x_attention")
        ]
    )
    calls = []
    monkeypatch.setattr(flips, "override_scorer", _recording(calls))
    packed = decision_flip(adapter, batch, maps)
    steps = int((packed.lengths - 1).sum())
    assert [c.numel() for c in calls] == [steps]  # one call: every step of every instance (all alive before it)
    assert bool(packed.flipped.any()) and bool((~packed.flipped).any())
    calls.clear()
    # max_rows bounds a packing scorer's calls from below only: it sizes its own passes; the calls are cut where
    # their [rows, T] overrides would pass PACKED_CALL_ELEMENTS
    _same(decision_flip(adapter, batch, maps, max_rows=10), packed)
    assert [c.numel() for c in calls] == [steps]
    calls.clear()
    monkeypatch.setattr(flips, "PACKED_CALL_ELEMENTS", 7 * batch["input_ids"].shape[1])
    _same(decision_flip(adapter, batch, maps, max_rows=5), packed)
    assert max(c.numel() for c in calls) == 7 and len(calls) > 1
    monkeypatch.setattr(flips, "PACKED_CALL_ELEMENTS", 1 << 22)
    _same(packed, decision_flip(Plain(adapter), batch, maps))  # the full passes' flips
    monkeypatch.setattr(flips, "packs_overrides", lambda scorer: False)  # the doubling passes of before
    calls.clear()
    _same(decision_flip(adapter, batch, maps), packed)
    assert len(calls) > 1


class Prechecked(HuggingFaceAdapter):
    """A replay wrong only without an override (row 0 shifted), saying it was checked on ``claim(out.logits)``."""

    claim = staticmethod(lambda logits: logits)

    def override_replay(self, embeddings, batch):
        out, scorer = super().override_replay(embeddings, batch)
        self.unoverridden = 0

        def wrong(rows, override):
            logits = scorer(rows, override).clone()
            if override is None:
                self.unoverridden += 1
                logits[rows == 0] += 1e-3
            return logits

        wrong.checked_logits = self.claim(out.logits)
        return out, wrong


@pytest.mark.parametrize("same_pass", [True, False])
def test_a_scorer_checked_on_this_very_pass_is_not_checked_on_it_again(same_pass):
    """The model's own check of its scorer on the pass (the packed scorer's, every row) is not repeated; a claim
    about any other tensor, even one of equal values, is not trusted: the comparison runs and drops the scorer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Prechecked(family_model("llama"))
    if not same_pass:
        model.claim = staticmethod(lambda logits: logits.clone())
    batch = family_batch("llama", False)
    with torch.no_grad():
        out, scorer = override_scorer(model, model.embed(batch), batch)
        _, packed = HuggingFaceAdapter.override_replay(model, model.embed(batch), batch)
    assert model.unoverridden == (0 if same_pass else 1)
    assert (scorer is not None) == same_pass  # the full-pass check under uniform attention runs in both cases
    assert packed.checked_logits is not None  # the real packed scorer records the pass it was checked on

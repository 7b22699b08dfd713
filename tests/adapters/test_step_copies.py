"""step_passes: one copy of a row per explained step, cut after the step, in dense passes within the token budget;
a flagged copy's output holds the step's own log-probability and its query row's logits (the model's own forward
of the whole batch is the oracle)."""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.adapters.huggingface.step_copies import STEP_LOGITS_ONLY
from tests.adapters.generators import CAUSAL, SEQ2SEQ, make


@pytest.mark.parametrize("tokens_per_pass", (1, 12, 10_000))
@pytest.mark.parametrize("family", ("llama", "marian"))
def test_every_wanted_pair_is_one_copy_cut_after_its_step_within_the_budget(family, tokens_per_pass):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    steps = adapter(batch).target_steps
    wanted = steps.clone()
    wanted[0, 1] = False  # a pair left out
    positions = [(batch["labels"][b] != -100).nonzero().flatten().tolist() for b in range(2)]
    seen = []
    for rows, ranks, part, target in adapter.step_passes(batch, wanted, tokens_per_pass):
        seen += list(zip(rows.tolist(), ranks.tolist()))
        cut = [positions[r][k] + 1 for r, k in zip(rows.tolist(), ranks.tolist())]
        if model.config.is_encoder_decoder:
            width, source = part["decoder_input_ids"].shape[1], part["input_ids"].shape[1]
            assert target.tolist() == [0] * len(cut) and (part["labels"] != -100).sum(1).tolist() == [1] * len(cut)
            assert source == int(batch["attention_mask"][rows].sum(1).max())  # trailing pads dropped
        else:
            width, source = part["input_ids"].shape[1], 0
            assert target.tolist() == ranks.tolist()
        assert width == max(cut)
        assert len(cut) == 1 or len(cut) * (width + source) <= tokens_per_pass
        assert part[STEP_LOGITS_ONLY] is True
    assert sorted(seen) == sorted(map(tuple, wanted.nonzero().tolist()))


@pytest.mark.parametrize("family", CAUSAL + SEQ2SEQ)
def test_a_flagged_copy_scores_its_step_as_the_models_own_forward(family):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    out = adapter(batch)
    with torch.no_grad():
        own = adapter(batch).logits
    (rows, ranks, part, target), *_ = adapter.step_passes(batch, out.target_steps, 10_000)
    copied = adapter(part)
    picked = copied.target_log_probs[torch.arange(rows.numel()), target]
    torch.testing.assert_close(picked, out.target_log_probs[rows, ranks], rtol=1e-12, atol=1e-12)
    queries = out.extras["step_queries"][rows, ranks]
    V = own.shape[-1]
    assert copied.logits.shape[-1] == V and copied.logits.shape[:2] == copied.target_steps.shape
    torch.testing.assert_close(
        copied.logits[torch.arange(rows.numel()), target], own[rows, queries], rtol=1e-12, atol=1e-12
    )

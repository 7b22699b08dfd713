"""DeceptionPenalty on generators (issue #31, item 5): Pruthi et al. penalised attention on their seq2seq tasks too.

Every explained target step's query row is penalised (decoder self-attention of a causal LM, cross-attention of an
encoder–decoder), checked against the model's own ``output_attentions`` rows; before, a generator's output fell
through to the classifier rule and penalised query row 0 of every example.
"""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.losses import DeceptionPenalty
from tests.adapters.generators import CAUSAL, SEQ2SEQ, make, source_mask


def _impermissible(model, batch) -> torch.Tensor:
    """The second real source token of every row is impermissible."""
    mask = source_mask(model, batch)
    first_two = mask.long().cumsum(1) == 2
    return mask & first_two


def _own_rows(model, batch, layer=-1):
    """``[(b, query, [heads, T] row)]`` for every target step, from the model's own forward."""
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "output_attentions": True}
    if model.config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        maps = model(**kwargs).cross_attentions[layer]
    else:
        maps = model(**kwargs).attentions[layer]
    rows = []
    for b in range(batch["input_ids"].shape[0]):
        for s in (batch["labels"][b] != -100).nonzero().flatten().tolist():
            query = s if model.config.is_encoder_decoder else s - 1
            rows.append(maps[b, :, query])
    return rows, maps


@pytest.mark.parametrize("family", CAUSAL + SEQ2SEQ)
@pytest.mark.parametrize("reduction", ("mean", "max"))
def test_every_target_steps_raw_row_is_penalised_as_the_models_own(family, reduction):
    model, batch = make(family)
    batch["impermissible"] = _impermissible(model, batch)
    adapter = HuggingFaceAdapter(model)
    with torch.no_grad():
        value = DeceptionPenalty(weight=0.5, reduction=reduction)(adapter(batch), batch)
        rows, _ = _own_rows(model, batch)
    terms = []
    b_of = [b for b in range(2) for _ in (batch["labels"][b] != -100).nonzero().flatten().tolist()]
    for b, row in zip(b_of, rows):  # [heads, T]: one term per step and head
        mass = row[:, batch["impermissible"][b]].sum(-1)
        terms.append(-torch.log1p(-mass))
    terms = torch.cat(terms)
    expected = 0.5 * (terms.mean() if reduction == "mean" else terms.max())
    torch.testing.assert_close(value, expected)


@pytest.mark.parametrize("family", ("llama", "marian"))
def test_the_step_distributions_are_penalised_with_source_attention(family):
    model, batch = make(family)
    batch["impermissible"] = _impermissible(model, batch)
    adapter = HuggingFaceAdapter(model)
    with torch.no_grad():
        out = adapter(batch)
        value = DeceptionPenalty(source="attention")(out, batch)
    steps = out.target_steps
    mass = (out.extras["step_attention"] * batch["impermissible"][:, None, :]).sum(-1)[steps]
    torch.testing.assert_close(value, -torch.log1p(-mass).mean())


def test_training_on_the_penalty_lowers_every_steps_impermissible_mass():
    model, batch = make("marian")
    model.float().train()
    batch["impermissible"] = _impermissible(model, batch)
    adapter = HuggingFaceAdapter(model)
    penalty = DeceptionPenalty(weight=1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.no_grad():
        before = penalty.masses(adapter(batch), batch)
    for _ in range(10):
        optimizer.zero_grad()
        penalty(adapter(batch), batch).backward()
        optimizer.step()
    with torch.no_grad():
        out = adapter(batch)
        after = penalty.masses(out, batch)
    real = out.target_steps[:, :, None].expand_as(after)
    assert after.shape == before.shape == (*out.target_steps.shape, model.config.decoder_attention_heads)
    assert after[real].mean() < 0.5 * before[real].mean()


def test_a_step_a_row_does_not_have_is_no_term():
    model, batch = make("bart")  # row 1 has three target steps, row 0 five
    batch["impermissible"] = _impermissible(model, batch)
    adapter = HuggingFaceAdapter(model)
    with torch.no_grad():
        out = adapter(batch)
        penalty = DeceptionPenalty()
        value = penalty(out, batch)
        masses = penalty.masses(out, batch)
    real = out.target_steps[:, :, None].expand_as(masses)
    assert int(real.sum()) == (5 + 3) * model.config.decoder_attention_heads
    torch.testing.assert_close(value, -torch.log1p(-masses[real]).mean())
    torch.testing.assert_close(penalty.last_mass, masses[real].mean())

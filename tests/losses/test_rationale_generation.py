"""RationaleSupervisionLoss on generators (issue #31, item 5): supervised alignment pulls each target step's attention
over the source toward its gold links (a ``[B, K, T]`` mask), checked against a hand KL per step."""

from __future__ import annotations

import pytest
import torch

from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.losses import RationaleSupervisionLoss
from tests.adapters.generators import make, source_mask


def _links(model, batch, steps: int) -> torch.Tensor:
    """``[B, K, T]``: target step k aligned with the (k mod n)-th real source token of its row (n its real count)."""
    mask = source_mask(model, batch)
    links = torch.zeros(mask.shape[0], steps, mask.shape[1], dtype=torch.bool)
    for b in range(mask.shape[0]):
        real = mask[b].nonzero().flatten()
        for k in range(steps):
            links[b, k, real[k % real.numel()]] = True
    links[0, 1] = False  # a step without gold links: no term
    return links


@pytest.mark.parametrize("family", ("llama", "marian"))
@pytest.mark.parametrize("kind", ("kl", "mass"))
def test_each_steps_attention_is_supervised_toward_its_links(family, kind):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    with torch.no_grad():
        out = adapter(batch)
        batch["alignment"] = _links(model, batch, out.target_steps.shape[1])
        loss = RationaleSupervisionLoss(weight=2.0, key="alignment", kind=kind)
        value = loss(out, batch)
    terms = []
    for b in range(2):
        for k in range(int(out.target_steps[b].sum())):
            gold = batch["alignment"][b, k]
            if not gold.any():
                continue
            row = out.extras["step_attention"][b, k]
            if kind == "kl":
                target = gold.double() / gold.sum()
                terms.append((target[gold] * (target[gold].log() - (row[gold] + 1e-10).log())).sum())
            else:
                terms.append(-torch.log(row[gold].sum() + 1e-10))
    torch.testing.assert_close(value, 2.0 * torch.stack(terms).mean())
    assert loss.seen_examples == int(out.target_steps.sum()) and loss.empty_examples == 1


def test_a_classifier_shaped_rationale_on_a_generator_names_the_step_shape():
    model, batch = make("llama")
    adapter = HuggingFaceAdapter(model)
    batch["alignment"] = source_mask(model, batch)
    with torch.no_grad(), pytest.raises(ValueError, match=r"expected \[B, K, T\]"):
        RationaleSupervisionLoss(key="alignment")(adapter(batch), batch)


def test_training_on_the_links_raises_their_attention_mass():
    model, batch = make("marian")
    model.float().train()
    adapter = HuggingFaceAdapter(model)
    with torch.no_grad():
        steps = adapter(batch).target_steps
    batch["alignment"] = _links(model, batch, steps.shape[1])
    loss = RationaleSupervisionLoss(key="alignment")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss(adapter(batch), batch)
    before = float(loss.last_mass)
    for _ in range(10):
        optimizer.zero_grad()
        loss(adapter(batch), batch).backward()
        optimizer.step()
    with torch.no_grad():
        loss(adapter(batch), batch)
    assert float(loss.last_mass) > before + 0.2

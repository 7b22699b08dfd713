"""``method_step_maps`` (the per-step maps of AttentionAudit's report examples and of AlignmentAudit) against hand
autograd: each map is the gradient of that step's log-probability, taken through the model's own forward of the
whole, uncut batch — for the adapter's cut copies (:mod:`lightning_xai.adapters.huggingface.step_copies`: decoder cut
after the step, source pads dropped, LM head at the query row only) and for whole copies of the rows (a generator
without the ``StepPasses`` capability), in one pass or one copy a pass. float64 models; the maps are float32, so
the tolerance is float32's (rtol 1e-5): cutting changes only the order of float summations."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

import lightning_xai.callbacks._audit.generation as generation
from lightning_xai.adapters import HuggingFaceAdapter
from lightning_xai.adapters.capabilities import StepPasses
from lightning_xai.callbacks._audit.generation import method_step_maps
from tests.adapters.generators import CAUSAL, SEQ2SEQ, make, source_mask


def _hand_step_gradients(model, batch):
    """``{(b, k): (∂ log p(y_k) / ∂ e [T, E] of row b, e [T, E])}`` through the model's own forward of the batch."""
    encoder = model.get_encoder() if model.config.is_encoder_decoder else model
    module = encoder.get_input_embeddings()
    labels = batch["labels"]
    out = {}
    for b in range(labels.shape[0]):
        positions = (labels[b] != -100).nonzero().flatten().tolist()
        for k, s in enumerate(positions):
            taken: list = []

            def hook(_, __, output, taken=taken):
                if taken:  # Marian shares its table with the decoder: the encoder's lookup runs first
                    return output
                taken.append(output.detach().requires_grad_(True))
                return taken[0]

            handle = module.register_forward_hook(hook)
            try:
                kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
                if model.config.is_encoder_decoder:
                    kwargs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels)
                    row = model(**kwargs).logits[b, s]
                else:
                    row = model(**kwargs).logits[b, s - 1]  # the logits at s - 1 score the token at s
            finally:
                handle.remove()
            (grad,) = torch.autograd.grad(row.log_softmax(-1)[labels[b, s]], taken[0])
            out[(b, k)] = grad[b], taken[0][b].detach()
    return out


@pytest.mark.parametrize("tokens_per_pass", (1, 8192))
@pytest.mark.parametrize("copies", ("cut", "whole rows"))
@pytest.mark.parametrize("family", CAUSAL + SEQ2SEQ)
def test_step_maps_are_the_gradients_of_each_steps_log_probability(family, copies, tokens_per_pass, monkeypatch):
    model, batch = make(family)
    adapter = HuggingFaceAdapter(model)
    assert isinstance(adapter, StepPasses)
    if copies == "whole rows":  # the path of a generator without the capability
        monkeypatch.setattr(generation, "StepPasses", type("Nothing", (), {}))
    steps = adapter(batch).target_steps
    maps = method_step_maps(
        adapter, batch, steps, ["gradient", "grad_x_input"], lambda m: {}, lambda m: nullcontext(), tokens_per_pass
    )
    mask = source_mask(model, batch)
    scale = adapter._embedding_scale  # Marian's encoder scales looked-up embeddings: x = s·e, ∂/∂x = (∂/∂e)/s
    expected = {name: torch.zeros(maps[name].shape, dtype=torch.float64) for name in maps}
    for (b, k), (grad, embeddings) in _hand_step_gradients(model, batch).items():
        expected["gradient"][b, k] = grad.norm(dim=-1) / scale * mask[b]
        expected["grad_x_input"][b, k] = (grad * embeddings).sum(-1) * mask[b]
    assert int(steps.sum()) == len(_hand_step_gradients(model, batch)) > 0
    for name in maps:
        assert maps[name].abs().sum() > 0
        torch.testing.assert_close(maps[name], expected[name].float(), rtol=1e-5, atol=1e-7)

"""shared_input_gradients: gradient and grad×input share one backward pass, and only when that is exact."""

import torch

from lightning_xai.attribution import attribute, shared_input_gradients
from lightning_xai.attribution import gradients as gradients_module


def _count_passes(monkeypatch):
    calls = []
    original = gradients_module._compute_input_gradients

    def counting(*args, **kwargs):
        calls.append(kwargs.get("detach_attention"))
        return original(*args, **kwargs)

    monkeypatch.setattr(gradients_module, "_compute_input_gradients", counting)
    return calls


def test_one_backward_pass_for_gradient_and_grad_x_input_with_equal_maps(trained_model, sst2_batch, monkeypatch):
    expected = {m: attribute(trained_model, sst2_batch, m) for m in ("gradient", "grad_x_input")}
    calls = _count_passes(monkeypatch)
    with shared_input_gradients():
        shared = {m: attribute(trained_model, sst2_batch, m) for m in ("gradient", "grad_x_input")}
    assert len(calls) == 1
    for method, scores in shared.items():
        assert torch.equal(scores, expected[method]), method


def test_different_inputs_or_options_are_recomputed(trained_model, sst2_batch, monkeypatch):
    calls = _count_passes(monkeypatch)
    other = dict(sst2_batch, input_ids=sst2_batch["input_ids"].roll(1, dims=1))
    with shared_input_gradients():
        attribute(trained_model, sst2_batch, "gradient")
        attribute(trained_model, sst2_batch, "grad_x_input", detach_attention=True)  # another gradient
        reference = attribute(trained_model, sst2_batch, "grad_x_input", target=0)  # another target
        attribute(trained_model, other, "grad_x_input", target=0)  # other inputs
        attribute(trained_model, sst2_batch, "grad_x_input", target=0, create_graph=True)  # never shared
    assert len(calls) == 5
    assert torch.equal(reference, attribute(trained_model, sst2_batch, "grad_x_input", target=0))


def test_nothing_is_kept_outside_the_context(trained_model, sst2_batch, monkeypatch):
    calls = _count_passes(monkeypatch)
    attribute(trained_model, sst2_batch, "gradient")
    attribute(trained_model, sst2_batch, "grad_x_input")
    assert len(calls) == 2 and gradients_module._shared is None


def test_a_batch_that_differs_beside_the_source_is_recomputed(monkeypatch):
    """Two copies of an encoder–decoder row with the same source but another decoder input and explained step: equal
    embeddings, token mask and target (step 0), yet another gradient (the per-step copies of method_step_maps)."""
    from lightning_xai.adapters import HuggingFaceAdapter
    from tests.adapters.generators import make

    model, batch = make("bart")
    adapter = HuggingFaceAdapter(model)
    decoder = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    first = {"input_ids": batch["input_ids"][:1], "attention_mask": batch["attention_mask"][:1]}
    first.update(labels=batch["labels"][:1, :2].clone(), decoder_input_ids=decoder[:1, :2])
    first["labels"][0, 0] = -100  # one step: the second target token
    second = dict(first, labels=batch["labels"][:1, :1], decoder_input_ids=decoder[:1, :1])  # the first
    calls = _count_passes(monkeypatch)
    with shared_input_gradients():
        a = attribute(adapter, first, "gradient", target=0)
        b = attribute(adapter, second, "gradient", target=0)
    assert len(calls) == 2
    assert torch.equal(b, attribute(adapter, second, "gradient", target=0)) and not torch.allclose(a, b)


def test_batches_with_values_that_do_not_compare_to_a_bool_still_share(trained_model, sst2_batch, monkeypatch):
    """A numpy array or a list of tensors in the batch (== is elementwise) neither breaks the comparison nor blocks
    sharing when it is the very same object."""
    import numpy as np

    batch = dict(sst2_batch, ids=np.arange(sst2_batch["input_ids"].shape[0]), rows=list(sst2_batch["input_ids"]))
    calls = _count_passes(monkeypatch)
    with shared_input_gradients():
        attribute(trained_model, batch, "gradient")
        attribute(trained_model, batch, "grad_x_input")
        attribute(trained_model, dict(batch, ids=batch["ids"].copy()), "grad_x_input")  # an equal copy: recomputed
    assert len(calls) == 2

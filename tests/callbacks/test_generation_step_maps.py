"""Issue #31: the examples a report shows of a generator audit keep their per-step maps — source tokens × target
steps, attention's row of each step and each method's map of that step's log-probability — and their target tokens'
words. An unmodified LightningModule holding a tiny causal LM (Llama, GPT-2) or encoder–decoder (BART), audited with
``AttentionAudit()``: the stored maps equal ``attribute(..., target="steps")`` and the model's own
``output_attentions`` rows (the oracle); only the first ``step_examples`` of the report's examples get them."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AttentionAudit, BatchResult
from lightning_xai.callbacks._audit.failures import spread_rows

KINDS = {"llama": True, "gpt2": True, "bart": False}  # kind -> causal


def fit(gen_kit, tmp_path, kind: str, callbacks):
    Generation, Verses = gen_kit.classes()
    dm = Verses(causal=KINDS[kind])
    pl.seed_everything(0, verbose=False)
    module = Generation(kind, dm.word_ids, 0)
    trainer = gen_kit.make_trainer(tmp_path, callbacks, max_epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    return module, dm, trainer


def audited_batch(audit, trainer, dm):
    """The audit subset of the val split as one batch, in subset order (row p is the example at position p)."""
    rows = [dm.val_dataloader().dataset[i] for i in audit.audit_indices(trainer, "val")]
    return dm.val_dataloader().collate_fn(rows)


def own_step_attention(hf, batch) -> list:
    """Per row ``[K_b, n_b]``: the last layer's head-mean attention row of each target step, from the transformers
    model's own ``output_attentions`` — a causal LM's self-attention at position s − 1, an encoder–decoder's
    cross-attention at s — over the row's source words (``source_words >= 0``), renormalised."""
    labels = batch["labels"]
    with torch.no_grad():
        if hf.config.is_encoder_decoder:
            out = hf(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                output_attentions=True,
                decoder_input_ids=hf.prepare_decoder_input_ids_from_labels(labels=labels),
            )
            maps, shift = out.cross_attentions[-1].double().mean(1), 0
        else:
            out = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True)
            maps, shift = out.attentions[-1].double().mean(1), 1
    rows = []
    for b in range(labels.shape[0]):
        source = batch["source_words"][b] >= 0
        steps = (labels[b] != -100).nonzero().flatten()
        picked = maps[b, steps - shift][:, source]
        rows.append(picked / picked.sum(-1, keepdim=True))
    return rows


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_report_examples_keep_step_maps_equal_to_attribute_and_the_models_own_attention(gen_kit, tmp_path, kind):
    audit = AttentionAudit()
    module, dm, trainer = fit(gen_kit, tmp_path, kind, [audit])
    model = audit.explainable(module)
    batch = audited_batch(audit, trainer, dm)
    module.model.eval()
    own = own_step_attention(module.model, batch)
    methods = {
        "gradient": attribute(model, batch, "gradient", target="steps"),
        "grad_x_input": attribute(model, batch, "grad_x_input", target="steps", absolute=True),
    }
    examples = audit.latest.examples
    assert len(examples) == 6 and [bool(e.step_maps) for e in examples] == [True] * 3 + [False] * 3  # step_examples=3
    for row, example in enumerate(examples[:3]):
        assert example.position == row
        source = batch["source_words"][row] >= 0
        target = batch["labels"][row][batch["labels"][row] != -100]
        assert example.target_token_ids == target.tolist()
        assert set(example.step_maps) == {"attention", "gradient", "grad_x_input"}
        K = len(target)
        stored = {name: torch.tensor(rows, dtype=torch.float64) for name, rows in example.step_maps.items()}
        assert stored["attention"].shape == (K, int(source.sum()))
        torch.testing.assert_close(stored["attention"], own[row], atol=1e-5, rtol=1e-4)
        for name, steps in methods.items():
            torch.testing.assert_close(stored[name], steps[row, :K][:, source].double(), atol=1e-6, rtol=1e-4)
        # the summed-target map is not one step's: the step maps are a view the summed map does not give
        assert not torch.allclose(stored["gradient"][0], torch.tensor(example.maps["gradient"], dtype=torch.float64))
    # the words: the verse's source and target (and the end of sequence)
    example = examples[0]
    verse = dm.val_verses[example.index]
    assert audit.example_tokens(trainer, module, example) == verse.source
    assert audit.example_tokens(trainer, module, example, target=True) == [*verse.target, "</s>"]


@pytest.mark.parametrize(
    "options, kept",
    [({"num_report_examples": 2}, 2), ({"step_examples": 5}, 5), ({"step_examples": 1, "per_step": True}, 1)],
)
def test_only_the_first_report_examples_get_step_maps(gen_kit, tmp_path, options, kept):
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), **options)
    module, dm, trainer = fit(gen_kit, tmp_path, "gpt2", [audit])
    model = audit.explainable(module)
    batch = audited_batch(audit, trainer, dm)
    steps = attribute(model, batch, "gradient", target="steps")
    examples = audit.latest.examples
    assert [bool(e.step_maps) for e in examples] == [True] * kept + [False] * (6 - kept)
    assert [e.target_token_ids is not None for e in examples] == [True] * kept + [False] * (6 - kept)
    for row, example in enumerate(examples[:kept]):
        source = batch["source_words"][row] >= 0
        K = len(example.target_token_ids)
        torch.testing.assert_close(
            torch.tensor(example.step_maps["gradient"]), steps[row, :K][:, source], atol=1e-6, rtol=1e-4
        )
    per_step = "per_step/kendall_tau/attention_vs_gradient/mean" in audit.history[-1]["metrics"]
    assert per_step == options.get("per_step", False)


def test_step_examples_is_a_count():
    for bad in (-1, True, 2.0):
        with pytest.raises(MisconfigurationException, match="step_examples"):
            AttentionAudit(step_examples=bad)


def test_a_batch_audited_in_part_keeps_no_steps_at_the_rows_left_out():
    found = BatchResult(step_maps={"attention": torch.ones(1, 2, 3)}, step_mask=torch.tensor([[True, False]]))
    spread = spread_rows(found, torch.tensor([1]), 3)
    assert spread.step_mask.tolist() == [[False, False], [True, False], [False, False]]
    assert spread.step_maps["attention"][1].tolist() == [[1.0] * 3] * 2
    assert torch.isnan(spread.step_maps["attention"][0]).all()

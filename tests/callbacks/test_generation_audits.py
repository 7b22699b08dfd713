"""Issue #31: the audit callbacks on text generators. A user's own LightningModule that trains a tiny causal LM
(Llama, GPT-2) or encoder–decoder (BART, T5) on short verses of the bundled Greek→English alignment corpus, audited with
the one line ``AttentionAudit()``: its logged numbers equal a direct ``attribute`` + metric computation on the same
subset (the oracle), free decoding explains the model's greedy output, per-step maps are compared over the steps
that exist, training is bit-identical with and without the audit, and the methods that cannot explain a target
sequence are refused by name."""

from __future__ import annotations

import math
import warnings

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.adapters.capabilities import TargetSequence
from lightning_xai.attribution import attribute
from lightning_xai.callbacks import AdversarialSearchAudit, AttentionAudit, SanityCheck
from lightning_xai.metrics.registry import AGREEMENT_METRICS

KINDS = {"llama": True, "gpt2": True, "bart": False, "t5": False}  # kind -> causal


def fit(gen_kit, tmp_path, kind: str, callbacks, epochs: int = 2, seed: int = 0):
    Generation, Verses = gen_kit.classes()
    dm = Verses(causal=KINDS[kind])
    pl.seed_everything(seed, verbose=False)
    module = Generation(kind, dm.word_ids, seed)
    trainer = gen_kit.make_trainer(tmp_path, callbacks, max_epochs=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    return module, dm, trainer


def audited_batch(audit, trainer, dm):
    """The audit subset of the val split as one batch (the oracle's input)."""
    rows = [dm.val_dataloader().dataset[i] for i in audit.audit_indices(trainer, "val")]
    return dm.val_dataloader().collate_fn(rows)


def mean_of(values: torch.Tensor) -> float:
    values = values.double()
    return float(values[torch.isfinite(values)].mean())


@pytest.mark.parametrize("kind", ["llama", "bart", "t5"])
def test_one_line_audit_of_a_generator_matches_a_direct_computation(gen_kit, tmp_path, kind):
    audit = AttentionAudit()
    module, dm, trainer = fit(gen_kit, tmp_path, kind, [audit])
    assert len(audit.history) == 2 and audit.history[-1]["num_examples"] == 6
    metrics = audit.history[-1]["metrics"]
    for pair in ("attention_vs_gradient", "attention_vs_grad_x_input", "gradient_vs_grad_x_input"):
        for metric in ("kendall_tau", "jsd", "topk_overlap"):
            assert f"{metric}/{pair}/mean" in metrics
    # the oracle: the adapter the audit explains, the audited rows, attribute() and the registry's metrics
    model = audit.explainable(module)
    assert isinstance(model, TargetSequence) and model.model is module.model  # found on the unmodified module
    batch = audited_batch(audit, trainer, dm)
    mask = model.token_mask(batch)
    maps = {
        "attention": attribute(model, batch, "attention"),
        "gradient": attribute(model, batch, "gradient"),
        "grad_x_input": attribute(model, batch, "grad_x_input", absolute=True),
    }
    for first, second in (("attention", "gradient"), ("attention", "grad_x_input"), ("gradient", "grad_x_input")):
        tau, _ = AGREEMENT_METRICS["kendall_tau"][0](maps[first], maps[second], mask)
        jsd = AGREEMENT_METRICS["jsd"][0](maps[first], maps[second], mask)
        assert metrics[f"kendall_tau/{first}_vs_{second}/mean"] == pytest.approx(mean_of(tau), abs=1e-6)
        assert metrics[f"jsd/{first}_vs_{second}/mean"] == pytest.approx(mean_of(jsd), abs=1e-5)
    # the maps cover the source tokens only, and the report's words are the source words
    example = audit.latest.examples[0]
    verse = dm.val_verses[example.index]
    assert audit.example_tokens(trainer, module, example) == verse.source
    assert example.label is None and example.prediction == -1
    with torch.no_grad():
        out = model(batch)
    whole = (out.target_log_probs * out.target_steps).sum(1)
    assert example.probability == pytest.approx(float(whole[0].exp()), rel=1e-5)


def test_per_step_agreement_is_computed_over_the_steps_that_exist(gen_kit, tmp_path):
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), per_step=True)
    module, dm, trainer = fit(gen_kit, tmp_path, "gpt2", [audit], epochs=1)
    metrics = audit.history[-1]["metrics"]
    assert "per_step/kendall_tau/attention_vs_gradient/mean" in metrics
    assert "per_step/kendall_tau/attention_vs_gradient/p_value/mean" not in metrics
    model = audit.explainable(module)
    batch = audited_batch(audit, trainer, dm)
    mask = model.token_mask(batch)
    with torch.no_grad():
        out = model(batch)
    steps = attribute(model, batch, "gradient", target="steps")
    per_row = []
    for b in range(steps.shape[0]):  # by hand: one τ per existing (b, k), the mean over the row's steps
        ks = out.target_steps[b].nonzero().flatten()
        tau, _ = AGREEMENT_METRICS["kendall_tau"][0](
            out.extras["step_attention"][b, ks], steps[b, ks], mask[b].expand(len(ks), -1)
        )
        tau = tau[torch.isfinite(tau)]
        per_row.append(float(tau.mean()) if tau.numel() else math.nan)
    assert metrics["per_step/kendall_tau/attention_vs_gradient/mean"] == pytest.approx(
        mean_of(torch.tensor(per_row)), abs=1e-6
    )
    assert metrics["per_step/kendall_tau/attention_vs_gradient/mean"] != pytest.approx(
        metrics["kendall_tau/attention_vs_gradient/mean"], abs=1e-6
    )


def test_free_decoding_explains_the_models_greedy_output(gen_kit, tmp_path):
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), decoding="free", max_new_tokens=4)
    module, dm, trainer = fit(gen_kit, tmp_path, "bart", [audit], epochs=1)
    model = audit.explainable(module)
    batch = model.greedy_targets(audited_batch(audit, trainer, dm), 4)
    assert batch["labels"].shape[1] <= 4
    mask = model.token_mask(batch)
    tau, _ = AGREEMENT_METRICS["kendall_tau"][0](
        attribute(model, batch, "attention"), attribute(model, batch, "gradient"), mask
    )
    logged = audit.history[-1]["metrics"]["kendall_tau/attention_vs_gradient/mean"]
    assert logged == pytest.approx(mean_of(tau), abs=1e-6)
    forced = AGREEMENT_METRICS["kendall_tau"][0](
        attribute(model, audited_batch(audit, trainer, dm), "attention"),
        attribute(model, audited_batch(audit, trainer, dm), "gradient"),
        mask,
    )[0]
    assert logged != pytest.approx(mean_of(forced), abs=1e-6)  # the batch's own labels give another number


def test_the_audit_leaves_training_bit_identical(gen_kit, tmp_path):
    plain, _, _ = fit(gen_kit, tmp_path / "plain", "llama", [])
    audit = AttentionAudit(per_step=True)
    audited, _, _ = fit(gen_kit, tmp_path / "audited", "llama", [audit])
    assert len(audit.history) == 2
    for (name, a), (_, b) in zip(plain.state_dict().items(), audited.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("method", ["lrp", "integrated_hessians", "attention_norm"])
def test_methods_that_read_class_logits_are_refused_by_name(gen_kit, tmp_path, method):
    audit = AttentionAudit(methods=("gradient", method))
    with pytest.raises(MisconfigurationException, match=f"with \\['{method}'\\].*read a classifier's"):
        fit(gen_kit, tmp_path, "llama", [audit], epochs=1)


def test_grad_attention_audits_a_causal_lm_and_is_refused_for_an_encoder_decoder(gen_kit, tmp_path):
    audit = AttentionAudit(methods=("gradient", "grad_attention"))
    module, dm, trainer = fit(gen_kit, tmp_path / "llama", "llama", [audit], epochs=1)
    model, batch = audit.explainable(module), audited_batch(audit, trainer, dm)
    tau, _ = AGREEMENT_METRICS["kendall_tau"][0](
        attribute(model, batch, "attention"), attribute(model, batch, "grad_attention"), model.token_mask(batch)
    )
    key = "kendall_tau/attention_vs_grad_attention/mean"
    assert audit.history[-1]["metrics"][key] == pytest.approx(mean_of(tau), abs=1e-6)
    with pytest.raises(MisconfigurationException, match=r"with \['grad_attention'\].*causal LMs only"):
        fit(gen_kit, tmp_path / "bart", "bart", [AttentionAudit(methods=("gradient", "grad_attention"))], epochs=1)


def test_generation_options_are_refused_for_a_classifier(kit, tmp_path):
    dm = kit.make_dm(train=32, val=8)
    with pytest.raises(MisconfigurationException, match="decoding='free'.*not a generator"):
        kit.make_trainer(tmp_path, [AttentionAudit(decoding="free")]).fit(kit.make_model(dm), datamodule=dm)
    with pytest.raises(MisconfigurationException, match="per_step=True"):
        kit.make_trainer(tmp_path, [AttentionAudit(per_step=True)]).fit(kit.make_model(dm), datamodule=dm)
    with pytest.raises(MisconfigurationException, match="decoding='beam'"):
        AttentionAudit(decoding="beam")
    with pytest.raises(MisconfigurationException, match="max_new_tokens=0"):
        AttentionAudit(max_new_tokens=0)


@pytest.mark.parametrize("callback", [AdversarialSearchAudit, SanityCheck])
def test_audits_that_cannot_explain_a_target_sequence_refuse_a_generator_by_name(gen_kit, tmp_path, callback):
    with pytest.raises(
        MisconfigurationException,
        match=f"{callback.__name__} does not audit text generators "
        r"\(BartForConditionalGeneration\)",
    ):
        fit(gen_kit, tmp_path, "bart", [callback()], epochs=1)

"""Issue #31: ErasureAudit on text generators. A user's own LightningModule that trains a tiny causal LM (Llama) or
encoder–decoder (BART) on short verses of the bundled Greek→English corpus, audited with the one line
``ErasureAudit()``: comprehensiveness and sufficiency equal hand re-runs of the transformers model on the source with
the top-ranked tokens deleted / kept alone, Σ over steps = per-token value × steps, the greedy-token flip equals a
hand loop deleting tokens in ranking order, and training is bit-identical with and without the audit."""

from __future__ import annotations

import math
import warnings

import pytest
import pytorch_lightning as pl
import torch

from lightning_xai.callbacks import AttentionBaselines, ErasureAudit

KINDS = {"llama": True, "bart": False}  # kind -> causal
SPECIALS = (0, 1, 2)  # the kit's pad, bos, eos


def fit(gen_kit, tmp_path, kind: str, callbacks, epochs: int = 2, weigh_source: bool = False):
    Generation, Verses = gen_kit.classes()
    dm = Verses(causal=KINDS[kind])
    pl.seed_everything(0, verbose=False)
    module = Generation(kind, dm.word_ids, 0)
    if weigh_source and not KINDS[kind]:  # a tiny random BART barely reads its source: weigh its cross-attention
        for layer in module.model.model.decoder.layers:
            with torch.no_grad():
                layer.encoder_attn.out_proj.weight.mul_(10.0)
    trainer = gen_kit.make_trainer(tmp_path, callbacks, max_epochs=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    return module, dm, trainer


def source_positions(ids: torch.Tensor, labels: torch.Tensor, causal: bool) -> torch.Tensor:
    before = (labels != -100).long().cumsum(0) == 0 if causal else torch.ones_like(ids, dtype=torch.bool)
    return (~torch.isin(ids, torch.tensor(SPECIALS)) & before).nonzero().flatten()


def hand_run(net, ids: torch.Tensor, labels: torch.Tensor, causal: bool):
    """(Σ_k log p(y_k), greedy tokens [K]) of one row, from the transformers model's own forward."""
    with torch.no_grad():
        logits = net(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], labels=labels[None]).logits[0]
    where = (labels != -100).nonzero().flatten()
    step_logits = logits[where - 1 if causal else where]
    log_probs = step_logits.log_softmax(-1).gather(-1, labels[where][:, None]).squeeze(-1)
    return float(log_probs.double().sum()), step_logits.argmax(-1)


def deleted(ids, labels, drop, causal):
    """The row with the source positions ``drop`` deleted (a causal LM's labels move with its ids)."""
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[drop] = False
    return ids[keep], labels[keep] if causal else labels


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_erasure_matches_hand_reruns_of_the_model_on_the_erased_source(gen_kit, tmp_path, kind):
    audit = ErasureAudit(rankings=("attention", "random"), k=0.5, budget=None)  # audits at every epoch, the last on
    # the final weights
    module, dm, trainer = fit(gen_kit, tmp_path, kind, [audit], weigh_source=True)
    assert len(audit.history) == 2
    assert audit.history[-1]["explained_quantity"] == "log-probability of the target sequence"
    net, causal = module.model.eval(), KINDS[kind]
    comps = []
    for example in audit.latest.examples:
        row = dm.val_dataloader().dataset[example.index]
        ids, labels = row["input_ids"], row["labels"]
        source = source_positions(ids, labels, causal)
        n, steps = source.numel(), int((labels != -100).sum())
        attention = torch.tensor(example.maps["attention"])  # the ranking the audit used, over the source tokens
        assert attention.numel() == n
        order = source[torch.sort(attention, descending=True, stable=True).indices]
        size = min(math.ceil(0.5 * n), n)
        full, greedy = hand_run(net, ids, labels, causal)
        comp = full - hand_run(net, *deleted(ids, labels, order[: min(size, n - 1)], causal), causal)[0]
        suff = full - hand_run(net, *deleted(ids, labels, order[size:], causal), causal)[0]
        values = example.values
        assert values["attention/comprehensiveness"] == pytest.approx(comp, abs=2e-4)
        assert values["attention/sufficiency"] == pytest.approx(suff, abs=2e-4)
        assert values["attention/comprehensiveness"] == pytest.approx(
            values["attention/comprehensiveness_per_token"] * steps, rel=1e-9, abs=1e-12
        )
        # the greedy-token flip: delete the top-ranked tokens one more at a time until a step's argmax changes
        first = next(
            (
                m
                for m in range(1, n)
                if not torch.equal(hand_run(net, *deleted(ids, labels, order[:m], causal), causal)[1], greedy)
            ),
            None,
        )
        assert values["attention/flipped"] == float(first is not None)
        if first is not None:
            assert values["attention/fraction_removed"] == pytest.approx(first / n)
            assert values["attention/attention_removed"] == pytest.approx(
                float(attention.sort(descending=True, stable=True).values[:first].sum()), abs=1e-6
            )
        comps.append(comp)
    metrics = audit.history[-1]["metrics"]
    assert metrics["attention/comprehensiveness/mean"] == pytest.approx(sum(comps) / len(comps), abs=2e-4)
    assert max(abs(c) for c in comps) > 1e-2  # the deletions change the target far beyond the tolerance


def test_both_callbacks_audit_a_causal_lm_with_one_line_and_leave_training_bit_identical(gen_kit, tmp_path):
    plain, _, _ = fit(gen_kit, tmp_path / "plain", "llama", [])
    erasure, baselines = ErasureAudit(), AttentionBaselines()
    audited, _, _ = fit(gen_kit, tmp_path / "audited", "llama", [erasure, baselines])
    for (name, a), (_, b) in zip(plain.state_dict().items(), audited.state_dict().items()):
        assert torch.equal(a, b), name
    logged = erasure.history[-1]["metrics"]
    for ranking in ("attention", "attention_gradient", "random"):
        for value in (
            "comprehensiveness",
            "sufficiency",
            "comprehensiveness_per_token",
            "sufficiency_per_token",
            "flipped",
            "steps_changed",
        ):
            assert math.isfinite(logged[f"{ranking}/{value}/mean"]), (ranking, value)
    assert "uniform/log_prob_change/mean" in baselines.history[-1]["metrics"]
    assert "permutation/greedy_token_changed/mean" in baselines.history[-1]["metrics"]


def test_methods_that_read_class_logits_are_refused_as_rankings(gen_kit, tmp_path):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=r"with \['lrp'\].*read a classifier's"):
        fit(gen_kit, tmp_path, "bart", [ErasureAudit(rankings=("attention", "lrp"))], epochs=1)

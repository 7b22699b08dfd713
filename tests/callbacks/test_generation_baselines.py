"""Issue #31: AttentionBaselines on text generators (Vashishth et al. 2019). A user's own LightningModule that trains a
tiny causal LM (Llama) or encoder–decoder (BART) on short verses of the bundled Greek→English corpus, audited with
the one line ``AttentionBaselines()``: the uniform-attention change of each target step's log-probability equals a
hand run of the transformers model whose eager attention is patched here (the last layer's step rows replaced,
independently of the adapter's override), the Σ over steps is consistent with the per-token mean, and training is
bit-identical with and without the audit."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
from transformers.models.bart import modeling_bart
from transformers.models.llama import modeling_llama

from lightning_xai.callbacks import AttentionBaselines

KINDS = {"llama": True, "gpt2": True, "bart": False}  # kind -> causal
SPECIALS = (0, 1, 2)  # the kit's pad, bos, eos
QUERY_SCALE, OUTPUT_SCALE = 100.0, 10.0


def fit(gen_kit, tmp_path, kind: str, callbacks, epochs: int = 2):
    Generation, Verses = gen_kit.classes()
    dm = Verses(causal=KINDS[kind])
    pl.seed_everything(0, verbose=False)
    module = Generation(kind, dm.word_ids, 0)
    # a tiny random model's last attention is near uniform and barely read (|Δ log p| ~ 1e-5): sharpen it and
    # weigh its output, so that the replaced rows change the target far beyond float rounding
    attention = last_attention(module.model, KINDS[kind])
    with torch.no_grad():
        attention.q_proj.weight.mul_(QUERY_SCALE)
        (attention.o_proj if KINDS[kind] else attention.out_proj).weight.mul_(OUTPUT_SCALE)
    trainer = gen_kit.make_trainer(tmp_path, callbacks, max_epochs=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    return module, dm, trainer


def last_attention(net, causal: bool):
    """The attention module whose step rows the override replaces: the last layer's self-attention of a causal LM,
    the last decoder layer's cross-attention of an encoder–decoder."""
    return net.model.layers[-1].self_attn if causal else net.model.decoder.layers[-1].encoder_attn


def one_row(dm, index: int):
    return dm.val_dataloader().collate_fn([dm.val_dataloader().dataset[index]])


def hand_step_log_probs(net, row, causal: bool) -> torch.Tensor:
    """``[K]`` log p(y_k | y_<k, source) of the one row's target from the transformers model's own forward."""
    labels = row["labels"][0]
    with torch.no_grad():
        logits = net(input_ids=row["input_ids"], attention_mask=row["attention_mask"], labels=row["labels"]).logits[0]
    where = (labels != -100).nonzero().flatten()
    queries = where - 1 if causal else where
    return logits[queries].log_softmax(-1).gather(-1, labels[where][:, None]).squeeze(-1).double()


def uniform_rows_patch(target, queries, source):
    """An eager attention function that calls transformers' own, then — only for ``target`` — gives every head's
    rows at ``queries`` a uniform distribution over ``source`` (the head keeps its mass elsewhere) and recomputes
    weights @ values."""

    def patch(original):
        def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
            out, weights = original(
                module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
            )
            if module is not target:
                return out, weights
            weights = weights.clone()
            other = (~source).to(weights.dtype)
            uniform = source.to(weights.dtype) / source.sum()
            for q in queries.tolist():
                row = weights[0, :, q]  # [heads, keys]
                kept = row * other
                weights[0, :, q] = kept + uniform * (1 - kept.sum(-1, keepdim=True))
            values = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
            return (weights @ values).transpose(1, 2).contiguous(), weights

        return attention

    return patch


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_uniform_attention_matches_a_hand_run_with_the_rows_replaced(gen_kit, tmp_path, monkeypatch, kind):
    audit = AttentionBaselines(num_permutations=3, budget=None)  # audits at every epoch, the last on the final weights
    module, dm, trainer = fit(gen_kit, tmp_path, kind, [audit])
    assert len(audit.history) == 2
    metrics = audit.history[-1]["metrics"]
    for part in ("uniform", "permutation"):
        for value in (
            "log_prob_change",
            "log_prob_change_per_token",
            "abs_log_prob_change_per_token",
            "greedy_token_changed",
        ):
            assert f"{part}/{value}/mean" in metrics and f"{part}/{value}/std" in metrics
    assert audit.history[-1]["explained_quantity"] == "log-probability of the target sequence"
    net = module.model.eval()
    causal = KINDS[kind]
    target, modeling = last_attention(net, causal), modeling_llama if causal else modeling_bart
    original = modeling.eager_attention_forward
    hand = []
    for example in audit.latest.examples:
        row = one_row(dm, example.index)
        labels, ids = row["labels"][0], row["input_ids"][0]
        where = (labels != -100).nonzero().flatten()
        before = (labels != -100).long().cumsum(0) == 0 if causal else torch.ones_like(ids, dtype=torch.bool)
        source = ~torch.isin(ids, torch.tensor(SPECIALS)) & before
        trained = hand_step_log_probs(net, row, causal)
        patched = uniform_rows_patch(target, where - 1 if causal else where, source)(original)
        monkeypatch.setattr(modeling, "eager_attention_forward", patched)
        uniform = hand_step_log_probs(net, row, causal)
        monkeypatch.setattr(modeling, "eager_attention_forward", original)
        delta = uniform - trained
        assert example.values["uniform/log_prob_change"] == pytest.approx(float(delta.sum()), abs=2e-4)
        assert example.values["uniform/log_prob_change_per_token"] == pytest.approx(float(delta.mean()), abs=2e-5)
        assert example.values["uniform/abs_log_prob_change_per_token"] == pytest.approx(
            float(delta.abs().mean()), abs=2e-5
        )
        # Σ over steps = the per-token mean × the row's steps
        assert example.values["uniform/log_prob_change"] == pytest.approx(
            example.values["uniform/log_prob_change_per_token"] * len(where), rel=1e-9, abs=1e-12
        )
        hand.append(float(delta.sum()))
        assert float(delta.abs().mean()) > 1e-3  # the replaced rows change the target far beyond the tolerances
    assert metrics["uniform/log_prob_change/mean"] == pytest.approx(sum(hand) / len(hand), abs=2e-4)


def test_permutations_change_the_target_and_free_decoding_explains_the_greedy_output(gen_kit, tmp_path):
    forced, free = (
        AttentionBaselines(num_permutations=4),
        AttentionBaselines(num_permutations=4, decoding="free", max_new_tokens=4, log_prefix="free"),
    )
    module, dm, trainer = fit(gen_kit, tmp_path, "bart", [forced, free], epochs=1)
    for audit in (forced, free):
        values = [e.values for e in audit.latest.examples]
        assert all(0.0 <= v["permutation/greedy_token_changed"] <= 1.0 for v in values)
        assert any(abs(v["permutation/log_prob_change"]) > 1e-6 for v in values)
    # free decoding scores the model's own greedy output: with the trained attention its argmax is the target itself,
    # so its target log-probability is the highest at every step, and no audit value equals the forced one
    model = free.explainable(module)
    batch = model.greedy_targets(
        dm.val_dataloader().collate_fn([dm.val_dataloader().dataset[i] for i in free.audit_indices(trainer, "val")]), 4
    )
    assert batch["labels"].shape[1] <= 4
    assert [e.values["uniform/log_prob_change"] for e in free.latest.examples] != pytest.approx(
        [e.values["uniform/log_prob_change"] for e in forced.latest.examples], abs=1e-9
    )


def test_the_audit_leaves_training_bit_identical(gen_kit, tmp_path):
    plain, _, _ = fit(gen_kit, tmp_path / "plain", "llama", [])
    audit = AttentionBaselines(num_permutations=3, budget=None)
    audited, _, _ = fit(gen_kit, tmp_path / "audited", "llama", [audit])
    assert len(audit.history) == 2
    for (name, a), (_, b) in zip(plain.state_dict().items(), audited.state_dict().items()):
        assert torch.equal(a, b), name


def test_options_that_do_not_apply_to_a_generator_are_refused_by_name(gen_kit, tmp_path):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=r"max_attention_bins\) bins a classifier's"):
        fit(gen_kit, tmp_path, "llama", [AttentionBaselines(max_attention_bins=(0.0, 0.5, 1.0))], epochs=1)

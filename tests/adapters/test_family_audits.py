"""Transformer families: the error paths that keep a wrong reading from passing silently, and the audits end to end.

Error paths: a causal row that sees one token, an unknown family, a logits mismatch found by the first-batch
self-check, an override on DeBERTa (no AttentionInterface). Audits: AttentionAudit + ErasureAudit +
AttentionBaselines in a real Trainer on the bundled pronoun data for one encoder and two decoder families.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader
from transformers import LlamaForSequenceClassification  # noqa: E402
from transformers.modeling_outputs import SequenceClassifierOutputWithPast  # noqa: E402

from lightning_xai.adapters import HuggingFaceAdapter, ProtocolError
from tests.adapters.test_families import PAD, family_batch, family_model


def test_causal_row_that_sees_one_token_is_refused():
    adapter = HuggingFaceAdapter(family_model("llama"), query_index=0)
    with pytest.raises(ValueError, match=r"sees only 1 real token.*Leave query_index=None"):
        adapter(family_batch("llama", left=False))


def test_unknown_family_is_refused_by_name():
    class CustomHead(LlamaForSequenceClassification):
        """A classifier with its own forward pooling the first and the last position: no pooling the adapter
        knows (the probe sees two positions per row reach the logits)."""

        def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, **kwargs):
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds
            ).last_hidden_state
            return SequenceClassifierOutputWithPast(logits=self.score((hidden[:, 0] + hidden[:, -1]) / 2))

    model = family_model("llama")
    custom = CustomHead(model.config).double().eval()
    with pytest.raises(ProtocolError, match=r"does not know where CustomHead.*Pass query_index="):
        HuggingFaceAdapter(custom)


def test_a_subclass_with_its_own_forward_is_probed_not_looked_up():
    """The family table describes transformers' classes; a user's forward is judged by what it does (before, any
    overridden forward was refused because its source text lacked transformers' variable names)."""

    class Relabelled(LlamaForSequenceClassification):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    class FirstToken(LlamaForSequenceClassification):
        def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, **kwargs):
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds
            ).last_hidden_state
            return SequenceClassifierOutputWithPast(logits=self.score(hidden[:, 0]))

    config = family_model("llama").config
    assert HuggingFaceAdapter(Relabelled(config).double().eval()).pooling == "last"
    assert HuggingFaceAdapter(FirstToken(config).double().eval(), check=False).pooling == "first"


def test_logits_self_check_catches_a_wrong_query_index():
    class Tempered(LlamaForSequenceClassification):
        def forward(self, *args, **kwargs):  # a custom head the adapter is told (wrongly) reads position -1
            return super().forward(*args, **kwargs)

    custom = Tempered(family_model("llama").config).double().eval()
    batch = family_batch("llama", left=False)  # right padding: position -1 is a pad for two rows
    adapter = HuggingFaceAdapter(custom, query_index=-1)
    with pytest.raises(ValueError, match=r"logits differ from Tempered's own by .*Check query_index"):
        adapter(batch)
    assert HuggingFaceAdapter(custom, query_index=-1).check_logits(family_batch("llama", left=True)) < 1e-9


def test_deberta_v1_attention_is_read_but_override_is_refused_by_name():
    """DeBERTa (v1) computes attention in its own modeling file (optionally mixing heads after the dropout):
    attention_override stays refused by name; its maps are read."""
    adapter = HuggingFaceAdapter(family_model("deberta"))
    batch = family_batch("deberta", left=False)
    out = adapter(batch)
    assert not adapter.overridable and len(out.raw_attentions) == 2
    with pytest.raises(ProtocolError, match=r"attention_override is not supported.*ErasureAudit, AttentionBaselines"):
        adapter(batch, attention_override=out.attention)


def test_deberta_v2_override_replaces_the_pooled_row_through_its_attention_dropout():
    """DeBERTa-v2 (native attention, no AttentionInterface) takes attention_override through a hook on its last
    attention module's dropout, attached for the override pass only: own rows give the logits back bit for bit, a
    uniform override is what the last layer's [CLS] row reads, every other row and layer is unchanged, and the
    replay scorer gives the full pass's logits."""
    from transformers import AutoModelForSequenceClassification

    from lightning_xai.attribution.override_replay import override_scorer

    config = family_model("deberta-v2").config
    config.initializer_range = 0.5  # peaked attention: an override moves the logits visibly
    torch.manual_seed(0)
    adapter = HuggingFaceAdapter(AutoModelForSequenceClassification.from_config(config).double().eval())
    batch = family_batch("deberta-v2", left=False)
    mask = batch["mask"]
    assert adapter.overridable
    with torch.no_grad():
        out = adapter(batch)
        again = adapter(batch, attention_override=out.extras["cls_rows"])
        uniform = mask.double() / mask.sum(-1, keepdim=True)
        moved = adapter(batch, attention_override=uniform)
        _, scorer = override_scorer(adapter, adapter.embed(batch), batch)
        replayed = scorer(torch.arange(3), uniform)
    assert torch.equal(again.logits, out.logits)
    assert float((moved.logits - out.logits).abs().max()) > 0.1
    read = moved.raw_attentions[-1][:, :, 0].masked_fill(~mask[:, None], 0.0)
    torch.testing.assert_close(read / read.sum(-1, keepdim=True), uniform[:, None].expand_as(read))
    assert torch.equal(moved.raw_attentions[-1][:, :, 1:], out.raw_attentions[-1][:, :, 1:])
    assert torch.equal(moved.raw_attentions[0], out.raw_attentions[0])
    torch.testing.assert_close(replayed, moved.logits)
    assert not any(m.dropout._forward_hooks for m in adapter._attention_modules)  # nothing left on the model


def test_decoder_logits_ignore_what_follows_the_last_token():
    """Right padding: the pads after a row's last real token change nothing (the head pools before them)."""
    adapter = HuggingFaceAdapter(family_model("qwen2"))
    batch = family_batch("qwen2", left=False)
    longer = {
        k: torch.cat([v, torch.full_like(v[:, :2], PAD if k == "input_ids" else 0)], 1) if v.dim() == 2 else v
        for k, v in batch.items()
    }
    longer["mask"] = longer["mask"].bool()
    with torch.no_grad():
        torch.testing.assert_close(adapter(longer).logits, adapter(batch).logits)


def _decoder_for_bert_vocab(family: str):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    extra = {"gpt2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=128)}.get(family, {})
    config = AutoConfig.for_model(
        family,
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
        num_labels=2,
        attn_implementation="eager",
        **extra,
    )
    return AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2"])
def test_audits_run_end_to_end_in_a_trainer(family, tokenizer, tmp_path):
    from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit
    from lightning_xai.data.hf import HFTextClassificationDataModule, WordDataset, WordPieceCollator
    from lightning_xai.models import HFClassifier

    pl.seed_everything(0, verbose=False)
    dm = HFTextClassificationDataModule(tokenizer, "pronoun", batch_size=8, train_limit=16, max_length=48)
    collate = WordPieceCollator(tokenizer, max_length=48, warn=False)
    val = DataLoader(WordDataset(dm.examples("val")[:8]), batch_size=8, collate_fn=collate)
    model = _decoder_for_bert_vocab(family) if family != "bert" else None
    if model is None:
        from transformers import BertConfig, BertForSequenceClassification

        model = BertForSequenceClassification(
            BertConfig(
                vocab_size=30522,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=128,
                attn_implementation="eager",
            )
        )
    module = HFClassifier(model=model, tokenizer=tokenizer)
    assert module.adapter.pooling == ("first" if family == "bert" else "last")
    common = dict(num_samples=8, every_n_epochs=0, on_validate=True, on_test=False, batch_size=8)
    audit = AttentionAudit(methods=["gradient", "leave_one_out"], metrics=["kendall_tau"], **common)
    erasure = ErasureAudit(rankings=("attention", "random"), **common)
    baselines = AttentionBaselines(num_permutations=4, **common)
    pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[audit, erasure, baselines],
    ).validate(module, val, verbose=False)
    taus = [v for k, v in audit.history[-1]["metrics"].items() if k.startswith("kendall_tau/") and k.endswith("/mean")]
    assert len(taus) == 3 and all(-1 <= t <= 1 for t in taus)  # attention_vs_* present: the row sees the sentence
    assert 0 <= erasure.history[-1]["metrics"]["attention/flipped/mean"] <= 1
    assert 0 <= baselines.history[-1]["metrics"]["uniform/flip_fraction"] <= 1


def test_deception_penalty_reads_the_decoder_row_the_head_pools():
    from lightning_xai.losses import DeceptionPenalty

    adapter = HuggingFaceAdapter(family_model("llama"))
    batch = dict(family_batch("llama", left=False))
    batch["impermissible"] = torch.zeros_like(batch["mask"])
    batch["impermissible"][:, 1] = True
    with torch.no_grad():
        out = adapter(batch)
    last = torch.tensor([6, 4, 3])
    expected = out.raw_attentions[-1][torch.arange(3), :, last, 1]  # [B, heads]: the last real token's rows
    masses = DeceptionPenalty(weight=1.0, reduction="mean").masses(out, batch)
    torch.testing.assert_close(masses.reshape(3, -1), expected)
    assert float(expected.min()) > 0  # row 0 (the old default) would give token 1 nothing in a causal model


def test_deberta_audits_that_replace_attention_run_on_v2_and_refuse_v1_by_name(tokenizer, tmp_path):
    """DeBERTa-v2 takes attention_override (a hook on its attention dropout): AttentionBaselines and ErasureAudit's
    decision flips run on it. DeBERTa v1 still takes none: they refuse it before the first audit, naming the model;
    AttentionAudit and ErasureAudit's ERASER part run."""
    from pytorch_lightning.utilities.exceptions import MisconfigurationException
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit
    from lightning_xai.data.hf import HFTextClassificationDataModule, WordDataset, WordPieceCollator
    from lightning_xai.models import HFClassifier

    def classifier(family):
        torch.manual_seed(0)
        config = AutoConfig.for_model(
            family,
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
            num_labels=2,
            attn_implementation="eager",
        )
        return HFClassifier(model=AutoModelForSequenceClassification.from_config(config), tokenizer=tokenizer)

    dm = HFTextClassificationDataModule(tokenizer, "pronoun", batch_size=8, train_limit=16, max_length=48)
    val = DataLoader(
        WordDataset(dm.examples("val")[:8]),
        batch_size=8,
        collate_fn=WordPieceCollator(tokenizer, max_length=48, warn=False),
    )
    common = dict(num_samples=8, every_n_epochs=0, on_validate=True, on_test=False, batch_size=8, strict=True)

    def validate(module, callback):
        pl.Trainer(
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
            callbacks=[callback],
        ).validate(module, val, verbose=False)
        return callback

    v2, v1 = classifier("deberta-v2"), classifier("deberta")
    baselines = validate(v2, AttentionBaselines(num_permutations=2, **common))
    assert 0 <= baselines.history[-1]["metrics"]["uniform/flip_fraction"] <= 1
    erasure = validate(v2, ErasureAudit(rankings=("attention",), **common))
    assert 0 <= erasure.history[-1]["metrics"]["attention/flipped/mean"] <= 1
    for refused in (AttentionBaselines(num_permutations=2, **common), ErasureAudit(rankings=("attention",), **common)):
        with pytest.raises(MisconfigurationException, match=r"replaces the model's attention.*Deberta"):
            validate(v1, refused)
        assert not refused.history
    erasure = validate(v1, ErasureAudit(rankings=("attention", "random"), decision_flip=False, **common))
    assert "attention/comprehensiveness/mean" in erasure.history[-1]["metrics"]
    audit = validate(v1, AttentionAudit(methods=["gradient"], metrics=["kendall_tau"], **common))
    assert any(k.startswith("kendall_tau/attention_vs_gradient") for k in audit.history[-1]["metrics"])

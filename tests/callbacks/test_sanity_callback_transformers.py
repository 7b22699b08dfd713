"""SanityCheck() on an unmodified user LightningModule around a ``transformers`` classifier: the checks a model can
take run; input invariance is skipped with one warning where a shift cannot be compensated (Llama), and refused by
name when it was asked for explicitly."""

from __future__ import annotations

import collections
import warnings

import pytest
import pytorch_lightning as pl
import torch
import transformers as tf
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from lightning_xai.callbacks import SanityCheck
from lightning_xai.data import read_split

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tokenizer(tmp_path) -> tf.BertTokenizerFast:
    counts = collections.Counter(t.lower() for e in read_split("sst2", "train")[:500] for t in e.tokens)
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(SPECIALS + [w for w, _ in counts.most_common(300)]) + "\n")
    return tf.BertTokenizerFast(vocab=str(path), do_lower_case=True)


class Data(pl.LightningDataModule):
    def __init__(self, tok) -> None:
        super().__init__()
        self.tokenizer = tok

    def _loader(self, split: str, n: int):
        rows = [
            dict(self.tokenizer(" ".join(e.tokens), truncation=True, max_length=24), labels=e.label)
            for e in read_split("sst2", split)[:n]
        ]
        return torch.utils.data.DataLoader(rows, batch_size=8, collate_fn=tf.DataCollatorWithPadding(self.tokenizer))

    def train_dataloader(self):
        return self._loader("train", 16)

    def val_dataloader(self):
        return self._loader("val", 8)


class UserModule(pl.LightningModule):
    def __init__(self, family: str, vocab_size: int) -> None:
        super().__init__()
        small = dict(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
        if family == "bert":
            self.model = tf.BertForSequenceClassification(tf.BertConfig(intermediate_size=32, **small))
        else:
            config = tf.LlamaConfig(intermediate_size=32, pad_token_id=0, **small)
            self.model = tf.LlamaForSequenceClassification(config)

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(**batch).loss)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(family: str, callback: SanityCheck, tmp_path) -> None:
    pl.seed_everything(0, verbose=False)
    tok = tokenizer(tmp_path)
    trainer = pl.Trainer(
        max_epochs=1,
        default_root_dir=str(tmp_path),
        logger=False,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(UserModule(family, len(tok)), datamodule=Data(tok))


SMALL_CHECK = dict(
    invariance_methods=["gradient", "grad_x_input"], randomization_methods=["gradient"], ig_steps=(8,), num_samples=8
)


def test_the_default_checks_run_on_a_bert_classifier(tmp_path):
    callback = SanityCheck(**SMALL_CHECK)
    fit("bert", callback, tmp_path)
    (record,) = callback.history
    metrics = record["metrics"]
    assert metrics["input_invariance/gradient/passes/mean"] == 1.0
    assert metrics["input_invariance/grad_x_input/passes/mean"] == 0.0
    assert "model_randomization/cascading/model.bert.embeddings/gradient/tau/mean" in metrics
    assert "completeness/integrated_gradients_8_steps/relative_error/mean" in metrics


def test_a_llama_classifier_skips_input_invariance_with_one_warning_and_runs_the_rest(tmp_path):
    callback = SanityCheck(**SMALL_CHECK)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit("llama", callback, tmp_path)
    skipped = [str(w.message) for w in caught if "input-invariance check is skipped" in str(w.message)]
    assert len(skipped) == 1 and "LlamaForSequenceClassification adds no position" in skipped[0]
    (record,) = callback.history
    assert not any(k.startswith("input_invariance/") for k in record["metrics"])
    assert "model_randomization/cascading/model.model.embed_tokens/gradient/tau/mean" in record["metrics"]
    assert set(callback.tables[0]) == {"model_randomization", "completeness"}


def test_input_invariance_asked_for_by_name_is_refused_on_a_llama_classifier(tmp_path):
    callback = SanityCheck(checks=["input_invariance"], **SMALL_CHECK)
    with pytest.raises(MisconfigurationException, match=r"adds no position or token-type embedding.*Leave 'input_inv"):
        fit("llama", callback, tmp_path)

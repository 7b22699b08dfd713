"""Small real SST-2 slices and tiny models for the callback tests."""

from __future__ import annotations

from typing import Dict, Optional

import pytest
import pytorch_lightning as pl

from lightning_xai.data import TextClassificationDataModule
from lightning_xai.data.readers import Example
from lightning_xai.models import AttentionClassifier

# Function words marked "impermissible" so the impermissible-attention monitor has something to measure on SST-2.
IMPERMISSIBLE = frozenset({"the", "a", "an", "and", "of", "to", "is", "'s"})


class SST2Slice(TextClassificationDataModule):
    """The bundled SST-2, cut to the first ``sizes[split]`` examples of each split.

    With ``impermissible=True`` every example carries a mask of the function words in :data:`IMPERMISSIBLE`.
    """

    def __init__(self, sizes: Optional[Dict[str, int]] = None, impermissible: bool = False, **kwargs) -> None:
        super().__init__("sst2", **kwargs)
        self.sizes = sizes or {"train": 192, "val": 48, "test": 48}
        self.impermissible = impermissible

    def examples(self, split):
        examples = super().examples(split)[: self.sizes[split]]
        if self.impermissible:
            examples = [
                Example(e.tokens, e.label, [int(t.lower() in IMPERMISSIBLE) for t in e.tokens]) for e in examples
            ]
        return examples


def make_dm(impermissible: bool = False, batch_size: int = 16, **sizes: int) -> SST2Slice:
    dm = SST2Slice(
        {"train": 192, "val": 48, "test": 48, **sizes}, impermissible=impermissible, batch_size=batch_size, seed=0
    )
    dm.setup("fit")
    return dm


def make_model(dm: TextClassificationDataModule, seed: int = 0, **kwargs) -> AttentionClassifier:
    pl.seed_everything(seed, verbose=False)
    options = dict(embedding_dim=16, hidden_dim=8, embedding_std=0.3, vocab=dm.vocab.itos)
    options.update(kwargs)
    return AttentionClassifier(dm.vocab_size, 2, **options)


def make_trainer(tmp_path, callbacks=(), **kwargs) -> pl.Trainer:
    options = dict(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
        deterministic=True,
    )
    options.update(kwargs)
    return pl.Trainer(callbacks=list(callbacks), **options)


#: cheap options for every attribution method used in the tests
FAST_METHODS = {"integrated_gradients": {"n_steps": 8}}


@pytest.fixture()
def dm() -> SST2Slice:
    return make_dm()


class _Kit:
    """The helpers above, handed to tests as a fixture (test modules cannot import conftest in importlib mode)."""

    make_dm = staticmethod(make_dm)
    make_model = staticmethod(make_model)
    make_trainer = staticmethod(make_trainer)
    FAST_METHODS = FAST_METHODS
    IMPERMISSIBLE = IMPERMISSIBLE


@pytest.fixture()
def kit() -> type:
    return _Kit


# --- generation: the bundled Greek→English alignment corpus, word-level, and tiny transformers generators ---------

#: pad, bos and eos ids of the generation kit's word vocabulary (words start at 3)
PAD, BOS, EOS = 0, 1, 2


def aligned_verses(split: str, n: int):
    """The first ``n`` short verses (≤ 10 source, ≤ 12 target words) of a split of the bundled alignment corpus."""
    from lightning_xai.data import read_alignments

    return [v for v in read_alignments(split) if len(v.source) <= 10 and len(v.target) <= 12][:n]


def word_vocab(verses) -> Dict[str, int]:
    words = sorted({w for v in verses for w in (*v.source, *v.target)})
    return {w: i + 3 for i, w in enumerate(words)}


def generation_row(verse, vocab: Dict[str, int], causal: bool) -> dict:
    """One example: a causal LM reads ``<bos> source target <eos>`` (labels -100 on ``<bos> source``); an
    encoder–decoder reads ``source <eos>`` and predicts ``target <eos>``. ``source_words`` / ``target_words`` give each
    position's word (-1: none), ``alignment`` the gold links, ``target_exclude`` the unaligned target words."""
    import torch

    src = [vocab[w] for w in verse.source]
    tgt = [vocab[w] for w in verse.target]
    n_src, n_tgt = len(src), len(tgt)
    if causal:
        ids = [BOS, *src, *tgt, EOS]
        labels = [-100] * (1 + n_src) + tgt + [EOS]
        source_words = [-1, *range(n_src)] + [-1] * (n_tgt + 1)
        target_words = [-1] * (1 + n_src) + list(range(n_tgt)) + [-1]
    else:
        ids = [*src, EOS]
        labels = [*tgt, EOS]
        source_words = [*range(n_src), -1]
        target_words = [*range(n_tgt), -1]
    return {
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor(labels),
        "source_words": torch.tensor(source_words),
        "target_words": torch.tensor(target_words),
        "alignment": list(verse.sure),
        "target_exclude": list(verse.target_exclude),
    }


def generation_collate(rows):
    """Right-padded batch: ``input_ids`` (0), ``attention_mask``, ``labels`` / maps (-100 / -1), lists kept."""
    from torch.nn.utils.rnn import pad_sequence

    out = {"input_ids": pad_sequence([r["input_ids"] for r in rows], batch_first=True, padding_value=PAD)}
    out["attention_mask"] = (out["input_ids"] != PAD).long()
    out["labels"] = pad_sequence([r["labels"] for r in rows], batch_first=True, padding_value=-100)
    for key in ("source_words", "target_words"):
        out[key] = pad_sequence([r[key] for r in rows], batch_first=True, padding_value=-1)
    for key in ("alignment", "target_exclude"):
        out[key] = [r[key] for r in rows]
    return out


def generator(kind: str, vocab_size: int, seed: int = 0):
    """A tiny random ``transformers`` generator (eager attention, no dropout): ``"llama"``, ``"gpt2"``, ``"bart"``,
    ``"t5"`` (no bos; decoding starts from pad, T5's convention)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    ids = dict(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    if kind == "llama":
        config = tf.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **ids,
        )
        return tf.LlamaForCausalLM._from_config(config, attn_implementation="eager")
    if kind == "gpt2":
        config = tf.GPT2Config(
            vocab_size=vocab_size,
            n_embd=16,
            n_layer=2,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
        return tf.GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    if kind == "t5":
        config = tf.T5Config(
            vocab_size=vocab_size,
            d_model=16,
            d_kv=4,
            d_ff=32,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            dropout_rate=0.0,
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=PAD,
        )
        return tf.T5ForConditionalGeneration._from_config(config, attn_implementation="eager")
    config = tf.BartConfig(
        vocab_size=vocab_size,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        decoder_start_token_id=EOS,
        forced_eos_token_id=None,
        **ids,
    )
    return tf.BartForConditionalGeneration._from_config(config, attn_implementation="eager")


def generation_classes():
    """The user's own code: a LightningModule that trains a generator and a DataModule of aligned verses (nothing
    of lightning_xai in either)."""
    import torch

    class Generation(pl.LightningModule):
        def __init__(self, kind: str, vocab: Dict[str, int], seed: int = 0) -> None:
            super().__init__()
            self.model = generator(kind, len(vocab) + 3, seed)
            self.vocab = ["<pad>", "<s>", "</s>", *vocab]

        def _loss(self, batch):
            return self.model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
            ).loss

        def training_step(self, batch, batch_idx):
            return self._loss(batch)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch), batch_size=len(batch["input_ids"]))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    class Verses(pl.LightningDataModule):
        def __init__(self, causal: bool, train: int = 12, val: int = 6) -> None:
            super().__init__()
            self.train_verses, self.val_verses = aligned_verses("train", train), aligned_verses("val", val)
            self.word_ids = word_vocab(self.train_verses + self.val_verses)
            self.causal = causal

        def _loader(self, verses, shuffle: bool):
            rows = [generation_row(v, self.word_ids, self.causal) for v in verses]
            return torch.utils.data.DataLoader(rows, batch_size=4, shuffle=shuffle, collate_fn=generation_collate)

        def train_dataloader(self):
            return self._loader(self.train_verses, shuffle=True)

        def val_dataloader(self):
            return self._loader(self.val_verses, shuffle=False)

    return Generation, Verses


class _GenerationKit:
    """The generation helpers above, as a fixture."""

    aligned_verses = staticmethod(aligned_verses)
    word_vocab = staticmethod(word_vocab)
    generation_row = staticmethod(generation_row)
    collate = staticmethod(generation_collate)
    generator = staticmethod(generator)
    classes = staticmethod(generation_classes)
    make_trainer = staticmethod(make_trainer)


@pytest.fixture()
def gen_kit() -> type:
    return _GenerationKit

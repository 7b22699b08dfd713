"""A tiny Greek→English Transformer trained from scratch on the bundled alignment corpus (for translation_bible.py).

* :class:`WordVocab`: a lower-cased word-level vocabulary built from the train split only (so a word is one
  piece on both sides and no pooling to words is needed); ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2.
* :func:`encode`: one verse as Marian inputs: source ids + ``</s>``; labels = target ids + ``</s>``. The decoder
  input is the labels shifted right behind ``<pad>`` (Marian's start token), so decoder step ``t`` predicts target
  word ``t``.
* :class:`TranslationModule`: a ``MarianMTModel`` from config (separate source and target embeddings, eager
  attention so ``output_attentions`` works) as a LightningModule; validation logs loss, token accuracy and
  perplexity under force decoding (teacher forcing).
* :func:`train_or_load`: trains with a real ``pl.Trainer`` on CPU, or loads the weights cached under
  ``examples/.cache/`` (keyed by every setting that changes them).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from lightning_xai.data import AlignedVerse

PAD, EOS, UNK = 0, 1, 2
SPECIALS = ("<pad>", "</s>", "<unk>")
CACHE = Path(__file__).resolve().parent / ".cache"


class WordVocab:
    """Lower-cased words → ids, most frequent first (ties alphabetical), after the special tokens (by default the
    three of translation; ``unk`` is the id of an unknown word)."""

    def __init__(
        self,
        sentences: Sequence[Sequence[str]],
        min_count: int = 1,
        specials: Sequence[str] = SPECIALS,
        unk: int = UNK,
    ):
        counts = Counter(w.lower() for sentence in sentences for w in sentence)
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        self.words: List[str] = list(specials) + words
        self.index: Dict[str, int] = {w: i for i, w in enumerate(self.words)}
        self.specials, self.unk = len(specials), unk

    def __len__(self) -> int:
        return len(self.words)

    def ids(self, sentence: Sequence[str]) -> List[int]:
        return [self.index.get(w.lower(), self.unk) for w in sentence]

    def decode(self, ids: Sequence[int]) -> List[str]:
        """The words of ``ids``, special tokens other than the unknown word left out."""
        return [self.words[i] for i in ids if i >= self.specials or i == self.unk]


@dataclass(frozen=True)
class ModelSettings:
    """Everything that changes the trained weights (the cache key)."""

    d_model: int = 128
    layers: int = 3
    heads: int = 4
    ffn_dim: int = 512
    dropout: float = 0.1
    epochs: int = 7
    batch_tokens: int = 2400
    lr: float = 1.5e-3
    warmup_steps: int = 200
    label_smoothing: float = 0.1
    train_verses: Optional[int] = None  # None: the whole train split
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def encode(verse: AlignedVerse, source_vocab: WordVocab, target_vocab: WordVocab) -> Tuple[List[int], List[int]]:
    """``(source ids + </s>, target ids + </s>)`` of one verse."""
    return source_vocab.ids(verse.source) + [EOS], target_vocab.ids(verse.target) + [EOS]


def collate(pairs: Sequence[Tuple[List[int], List[int]]]) -> Dict[str, Tensor]:
    """Pad a list of encoded pairs: ``input_ids``/``attention_mask`` (source), ``labels`` (−100 at padding)."""
    S, T = max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)
    input_ids = torch.full((len(pairs), S), PAD)
    labels = torch.full((len(pairs), T), -100)
    for i, (s, t) in enumerate(pairs):
        input_ids[i, : len(s)] = torch.tensor(s)
        labels[i, : len(t)] = torch.tensor(t)
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(PAD).long(), "labels": labels}


class TokenBudgetSampler(Sampler):
    """Batches of similar-length verses holding about ``tokens`` source+target tokens each, shuffled per epoch."""

    def __init__(self, lengths: Sequence[int], tokens: int, shuffle: bool, seed: int = 0):
        self.lengths, self.tokens, self.shuffle, self.seed, self.epoch = list(lengths), tokens, shuffle, seed, 0
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])
        self.batches: List[List[int]] = []
        batch: List[int] = []
        for i in order:
            if batch and (len(batch) + 1) * self.lengths[i] > tokens:
                self.batches.append(batch)
                batch = []
            batch.append(i)
        if batch:
            self.batches.append(batch)

    def __iter__(self) -> Iterator[List[int]]:
        batches = list(self.batches)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(batches)
            self.epoch += 1
        return iter(batches)

    def __len__(self) -> int:
        return len(self.batches)


def loader(pairs: Sequence[Tuple[List[int], List[int]]], tokens: int, shuffle: bool, seed: int = 0) -> DataLoader:
    sampler = TokenBudgetSampler([len(s) + len(t) for s, t in pairs], tokens, shuffle, seed)
    return DataLoader(list(pairs), batch_sampler=sampler, collate_fn=collate)


def build_model(settings: ModelSettings, source_size: int, target_size: int) -> torch.nn.Module:
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=source_size,
        decoder_vocab_size=target_size,
        share_encoder_decoder_embeddings=False,
        d_model=settings.d_model,
        encoder_layers=settings.layers,
        decoder_layers=settings.layers,
        encoder_attention_heads=settings.heads,
        decoder_attention_heads=settings.heads,
        encoder_ffn_dim=settings.ffn_dim,
        decoder_ffn_dim=settings.ffn_dim,
        dropout=settings.dropout,
        attention_dropout=0.0,
        activation_dropout=0.0,
        max_position_embeddings=128,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
        forced_eos_token_id=None,
        scale_embedding=True,
    )
    config._attn_implementation = "eager"
    return MarianMTModel(config)


class EpochLog(pl.Callback):
    """Prints the validation figures after every epoch (the Trainer's progress bar and logger are off)."""

    def __init__(self, log: Callable[[str], None]):
        self.write = log

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
        self.write(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}, step {trainer.global_step}: {metrics}")


class TranslationModule(pl.LightningModule):
    """The Marian model, trained with label-smoothed cross-entropy, AdamW and linear warm-up then 1/√step decay."""

    def __init__(self, settings: ModelSettings, source_size: int, target_size: int):
        super().__init__()
        self.settings = settings
        self.model = build_model(settings, source_size, target_size)

    def forward(self, **batch: Tensor):
        return self.model(**batch)

    def training_step(self, batch: Dict[str, Tensor], batch_idx: int) -> Tensor:
        logits = self.model(**batch).logits
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1),
            batch["labels"].flatten(),
            ignore_index=-100,
            label_smoothing=self.settings.label_smoothing,
        )
        self.log("train_loss", loss, prog_bar=True, batch_size=int(batch["labels"].ne(-100).sum()))
        return loss

    def validation_step(self, batch: Dict[str, Tensor], batch_idx: int) -> None:
        stats = force_decoding_stats(self.model, batch)
        n = float(stats["tokens"])
        self.log("val_nll", stats["nll"] / n, batch_size=int(n))
        self.log("val_token_accuracy", stats["correct"] / n, batch_size=int(n), prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.settings.lr, betas=(0.9, 0.98), weight_decay=0.01)
        warmup = self.settings.warmup_steps

        def schedule(step: int) -> float:
            step = max(step, 1)
            return min(step / warmup, math.sqrt(warmup / step))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]


@torch.no_grad()
def force_decoding_stats(model: torch.nn.Module, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Summed NLL, correct argmax predictions and token count of the reference targets (``</s>`` included)."""
    logits = model(**batch).logits
    labels = batch["labels"]
    real = labels.ne(-100)
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
    correct = (logits.argmax(-1).eq(labels) & real).sum()
    return {"nll": nll, "correct": correct.double(), "tokens": real.sum().double()}


def evaluate_force_decoding(model: torch.nn.Module, pairs: Sequence[Tuple[List[int], List[int]]]) -> Dict[str, float]:
    """Token accuracy and perplexity of the references under teacher forcing (eval mode)."""
    model.eval()
    totals = {"nll": 0.0, "correct": 0.0, "tokens": 0.0}
    for batch in loader(pairs, 4000, shuffle=False):
        for k, v in force_decoding_stats(model, batch).items():
            totals[k] += float(v)
    return {
        "token_accuracy": totals["correct"] / totals["tokens"],
        "perplexity": math.exp(totals["nll"] / totals["tokens"]),
    }


def train_or_load(
    settings: ModelSettings,
    train: Sequence[AlignedVerse],
    val: Sequence[AlignedVerse],
    cache: Optional[Path] = CACHE,
    log: Callable[[str], None] = print,
) -> Tuple[torch.nn.Module, WordVocab, WordVocab, bool]:
    """The trained model (eval mode), the two vocabularies, and whether it came from the cache."""
    train = list(train)[: settings.train_verses] if settings.train_verses else list(train)
    source_vocab = WordVocab([v.source for v in train])
    target_vocab = WordVocab([v.target for v in train])
    path = None if cache is None else Path(cache) / f"translation_{settings.key()}.pt"
    module = TranslationModule(settings, len(source_vocab), len(target_vocab))
    if path is not None and path.exists():
        module.model.load_state_dict(torch.load(path, map_location="cpu"))
        module.model.eval()
        return module.model, source_vocab, target_vocab, True
    pl.seed_everything(settings.seed, verbose=False)
    module = TranslationModule(settings, len(source_vocab), len(target_vocab))
    train_pairs = [encode(v, source_vocab, target_vocab) for v in train]
    val_pairs = [encode(v, source_vocab, target_vocab) for v in val]
    trainer = pl.Trainer(
        max_epochs=settings.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        callbacks=[EpochLog(log)],
    )
    trainer.fit(
        module,
        loader(train_pairs, settings.batch_tokens, shuffle=True, seed=settings.seed),
        loader(val_pairs, 4000, shuffle=False),
    )
    module.model.eval()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(module.model.state_dict(), path)
    return module.model, source_vocab, target_vocab, False

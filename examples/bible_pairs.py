"""A pair task on the bundled Greek–English verses: is this English verse the translation of this Greek verse?

For Vashishth et al. (2019)'s comparison (``vashishth_attention_dependence.py``): single-sequence classification,
a pair task and translation audited the same way.

* :func:`length_matched_pairs`: every verse of a split gives one **positive** (its Greek, its own English) and one
  **negative** (its Greek, the English of another verse of the same split). The negative's English is drawn with a
  fixed seed among the verses whose English has the length (in tokens) closest to the true translation's — the same
  length wherever the split has one, and never the same lower-cased text — so the lengths alone do not give the
  label away. Balanced classes: as many positives as negatives.
* :class:`PairVocab`: lower-cased words of both languages (train split only); ``[PAD]`` 0, ``[UNK]`` 1. Greek and
  English words never collide (different alphabets), so one embedding table serves both.
* :class:`PairAttentionClassifier`: Vashishth et al.'s pair model (their SNLI/QA models, after Rocktäschel et al.):
  a BiLSTM over each verse, the Greek verse's mean state ``q``, an additive attention over the **English** verse's
  states conditioned on it, ``α_t = softmax_t vᵀ tanh(W h_t + U q)``, context ``c = Σ_t α_t h_t`` and an MLP over
  ``[c; q; c ⊙ q; |c − q|]``. It speaks the package's ``ExplainableModel`` protocol with the English side as the
  explained sequence (``input_ids``/``mask``; the Greek in ``greek_ids``/``greek_mask``), so the audits replace
  ``α`` (uniform = the mean of the English states) with everything before it fixed, and its
  ``override_replay`` reruns only the pooling and the MLP.
* :func:`train_or_load`: trains it in a real ``pl.Trainer`` on CPU, with fresh length-matched negatives every epoch
  (seed + epoch), or loads the weights cached under ``examples/.cache`` (keyed by every setting that changes them).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
import torchmetrics
from torch import Tensor, nn
from torch.utils.data import DataLoader
from translation_model import WordVocab

from lightning_xai.adapters.protocol import Batch, ExplainOutput, check_embeddings
from lightning_xai.data import AlignedVerse
from lightning_xai.models.attention import masked_softmax
from lightning_xai.models.encoders import LSTMEncoder
from lightning_xai.models.steps import ClassifierSteps

PAD, UNK = 0, 1
SPECIALS = ("[PAD]", "[UNK]")
CACHE = Path(__file__).resolve().parent / ".cache"


@dataclass(frozen=True)
class VersePair:
    """The Greek of verse ``greek`` read with the English of verse ``english`` (indices into one split)."""

    greek: int
    english: int
    label: int  # 1: ``english`` is ``greek``'s own translation


def length_matched_pairs(verses: Sequence[AlignedVerse], seed: int) -> List[VersePair]:
    """One positive and one length-matched negative per verse, in verse order (see the module docstring).

    Example:
        >>> from lightning_xai.data import read_alignments
        >>> verses = read_alignments("val")
        >>> pairs = length_matched_pairs(verses, seed=0)
        >>> len(pairs), sum(p.label for p in pairs), pairs[0]
        (314, 157, VersePair(greek=0, english=0, label=1))
        >>> negative = pairs[1]
        >>> negative.label, len(verses[negative.english].target) == len(verses[0].target)
        (0, True)
    """
    rng = random.Random(seed)
    texts = [tuple(w.lower() for w in v.target) for v in verses]
    by_length: Dict[int, List[int]] = defaultdict(list)
    for i, v in enumerate(verses):
        by_length[len(v.target)].append(i)
    lengths = sorted(by_length)
    pairs: List[VersePair] = []
    for i, v in enumerate(verses):
        others: List[int] = []
        for length in sorted(lengths, key=lambda n: (abs(n - len(v.target)), n)):  # nearest lengths first
            others = [j for j in by_length[length] if texts[j] != texts[i]]
            if others:
                break
        if not others:
            raise ValueError(f"Verse {v.verse} has no other English text in the split to serve as its negative.")
        pairs += [VersePair(i, i, 1), VersePair(i, rng.choice(others), 0)]
    return pairs


def length_baseline_accuracy(train: Sequence[AlignedVerse], test: Sequence[AlignedVerse], seed: int) -> float:
    """Test accuracy of the best rule that reads only lengths: "a translation iff ``|log(m/n) − μ| ≤ τ``".

    ``n`` / ``m``: the Greek / English lengths of a pair, ``μ`` the mean log length ratio of the train verses, ``τ``
    the threshold with the best accuracy on the train pairs (negatives drawn with ``seed``); test pairs with ``seed``.

    Example:
        >>> from lightning_xai.data import read_alignments
        >>> 0.45 < length_baseline_accuracy(read_alignments("val"), read_alignments("val"), seed=0) < 0.6
        True
    """

    def features(verses: Sequence[AlignedVerse]) -> Tuple[Tensor, Tensor]:
        pairs = length_matched_pairs(verses, seed)
        ratio = [math.log(len(verses[p.english].target) / len(verses[p.greek].source)) for p in pairs]
        return torch.tensor(ratio, dtype=torch.float64), torch.tensor([p.label for p in pairs])

    mean = sum(math.log(len(v.target) / len(v.source)) for v in train) / len(train)
    ratio, labels = features(train)
    distance = (ratio - mean).abs()
    accuracy = [((distance <= tau).long() == labels).double().mean() for tau in distance.unique()]
    tau = distance.unique()[int(torch.stack(accuracy).argmax())]
    ratio, labels = features(test)
    return float((((ratio - mean).abs() <= tau).long() == labels).double().mean())


class PairVocab(WordVocab):
    """Lower-cased words of both languages → ids, most frequent first (ties alphabetical), after ``SPECIALS``.

    Example:
        >>> vocab = PairVocab([["Ἀρχὴ", "τοῦ"], ["The", "beginning", "the"]])
        >>> len(vocab), vocab.ids(["the", "End"])
        (6, [2, 1])
    """

    def __init__(self, sentences: Sequence[Sequence[str]], min_count: int = 1):
        super().__init__(sentences, min_count, specials=SPECIALS, unk=UNK)


def encode_pair(verses: Sequence[AlignedVerse], pair: VersePair, vocab: PairVocab) -> Dict[str, Any]:
    """The English ids (the attended side), the Greek ids and the label of one pair.

    Example:
        >>> verse = AlignedVerse("1", ["λόγος"], ["the", "word"], [0, 0], [(0, 1)])
        >>> encode_pair([verse], VersePair(0, 0, 1), PairVocab([["λόγος"], ["the", "word"]]))
        {'input_ids': [2, 3], 'greek_ids': [4], 'label': 1}
    """
    return {
        "input_ids": vocab.ids(verses[pair.english].target),
        "greek_ids": vocab.ids(verses[pair.greek].source),
        "label": pair.label,
    }


def _pad(rows: Sequence[List[int]]) -> Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), PAD)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def collate_pairs(items: Sequence[Dict[str, Any]]) -> Dict[str, Tensor]:
    """Right-pad encoded pairs: ``input_ids``/``mask`` (English), ``greek_ids``/``greek_mask``, ``labels``.

    Example:
        >>> batch = collate_pairs([{"input_ids": [5, 6], "greek_ids": [7], "label": 1},
        ...                        {"input_ids": [5], "greek_ids": [8, 9], "label": 0}])
        >>> batch["mask"].int().tolist(), batch["greek_mask"].int().tolist(), batch["labels"].tolist()
        ([[1, 1], [1, 0]], [[1, 0], [1, 1]], [1, 0])
    """
    english, greek = _pad([i["input_ids"] for i in items]), _pad([i["greek_ids"] for i in items])
    return {
        "input_ids": english,
        "mask": english.ne(PAD),
        "greek_ids": greek,
        "greek_mask": greek.ne(PAD),
        "labels": torch.tensor([i["label"] for i in items]),
    }


def pair_loader(
    verses: Sequence[AlignedVerse], vocab: PairVocab, seed: int, batch_size: int = 64, shuffle: bool = False
) -> DataLoader:
    """The split's length-matched pairs (negatives drawn with ``seed``) as batches of :func:`collate_pairs`."""
    items = [encode_pair(verses, pair, vocab) for pair in length_matched_pairs(verses, seed)]
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(items, batch_size=batch_size, shuffle=shuffle, collate_fn=collate_pairs, generator=generator)


class PairAttentionClassifier(ClassifierSteps, pl.LightningModule):
    """Attention over the English verse conditioned on the Greek verse (see the module docstring).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = PairAttentionClassifier(vocab_size=10, embedding_dim=4, hidden_dim=3).eval()
        >>> batch = collate_pairs([{"input_ids": [5, 6, 7], "greek_ids": [8], "label": 1}])
        >>> out = model(batch)
        >>> out.logits.shape, round(float(out.attention.sum()), 6)
        (torch.Size([1, 2]), 1.0)
        >>> uniform = model(batch, attention_override=torch.full((1, 3), 1 / 3)).extras["context"]
        >>> bool(torch.allclose(uniform, out.hidden_states.mean(1)))  # uniform attention: the mean English state
        True
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int = 64,
        hidden_dim: int = 64,
        num_classes: int = 2,
        dropout: float = 0.1,
        lr: float = 2e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=PAD)
        self.dropout = nn.Dropout(dropout)
        self.greek_encoder = LSTMEncoder(embedding_dim, hidden_dim)
        self.english_encoder = LSTMEncoder(embedding_dim, hidden_dim)
        width = self.english_encoder.output_dim
        self.key = nn.Linear(width, width // 2)
        self.query = nn.Linear(width, width // 2, bias=False)
        self.score = nn.Linear(width // 2, 1, bias=False)
        self.classifier = nn.Sequential(nn.Linear(4 * width, width), nn.Tanh(), nn.Linear(width, num_classes))
        self.objectives = nn.ModuleList()
        metrics = lambda: torchmetrics.MetricCollection(  # noqa: E731
            {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)}
        )
        self.val_metrics = metrics().clone(prefix="val/")
        self.test_metrics = metrics().clone(prefix="test/")

    # --- the ExplainableModel protocol (the English verse is the explained sequence) ----------------------------
    def embed(self, batch: Batch) -> Tensor:
        return self.embedding(batch["input_ids"])

    def token_mask(self, batch: Batch) -> Tensor:
        return batch["mask"]

    def forward_from_embeddings(
        self, embeddings: Tensor, batch: Batch, *, attention_override: Optional[Tensor] = None
    ) -> ExplainOutput:
        hidden, query = self._encode(embeddings, batch)
        return self._pool_and_classify(hidden, query, batch["mask"], attention_override)

    def forward(self, batch: Batch, attention_override: Optional[Tensor] = None) -> ExplainOutput:
        return self.forward_from_embeddings(self.embed(batch), batch, attention_override=attention_override)

    def override_replay(self, embeddings: Tensor, batch: Batch) -> Tuple[ExplainOutput, Callable[..., Tensor]]:
        """The pass, and a scorer of overrides that reruns only the pooling and the MLP (both encoders are fixed)."""
        hidden, query = self._encode(embeddings, batch)
        out = self._pool_and_classify(hidden, query, batch["mask"], None)

        def scorer(rows: Tensor, override: Optional[Tensor]) -> Tensor:
            mask = batch["mask"].index_select(0, rows)
            return self._pool_and_classify(hidden[rows], query[rows], mask, override).logits

        return out, scorer

    # --- the network ------------------------------------------------------------------------------------------
    def _encode(self, embeddings: Tensor, batch: Batch) -> Tuple[Tensor, Tensor]:
        """English states ``[B, T, 2H]`` and the Greek verse's mean state ``q`` ``[B, 2H]``."""
        mask = self.token_mask(batch)
        check_embeddings(embeddings, mask)
        hidden = self.english_encoder(self.dropout(embeddings), mask)
        greek_mask = batch["greek_mask"]
        greek = self.greek_encoder(self.dropout(self.embedding(batch["greek_ids"])), greek_mask)
        weights = greek_mask.unsqueeze(-1).to(greek.dtype)
        return hidden, (greek * weights).sum(1) / weights.sum(1)

    def _pool_and_classify(
        self, hidden: Tensor, query: Tensor, mask: Tensor, attention_override: Optional[Tensor]
    ) -> ExplainOutput:
        scores = self.score(torch.tanh(self.key(hidden) + self.query(query).unsqueeze(1))).squeeze(-1)
        scores = scores.masked_fill(~mask, float("-inf"))
        if attention_override is None:
            attention = masked_softmax(scores, mask)
        else:
            if attention_override.shape != mask.shape:
                raise ValueError(
                    f"attention_override {tuple(attention_override.shape)} is not [B, T] {tuple(mask.shape)}."
                )
            attention = attention_override.masked_fill(~mask, 0.0).to(hidden.dtype)
        context = torch.einsum("bt,bth->bh", attention, hidden)
        features = torch.cat([context, query, context * query, (context - query).abs()], dim=-1)
        return ExplainOutput(
            logits=self.classifier(features),
            attention=attention,
            hidden_states=hidden,
            attention_scores=scores,
            extras={"context": context, "query": query},
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"])


@dataclass(frozen=True)
class PairSettings:
    """Everything that changes the trained weights (the cache key)."""

    embedding_dim: int = 64
    hidden_dim: int = 64
    dropout: float = 0.1
    epochs: int = 6
    batch_size: int = 32
    lr: float = 2e-3
    min_count: int = 1
    train_verses: Optional[int] = None  # None: the whole train split
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


class FreshNegatives(pl.LightningDataModule):
    """Train pairs with negatives drawn anew every epoch (seed + epoch); validation pairs drawn with the seed."""

    def __init__(
        self, train: Sequence[AlignedVerse], val: Sequence[AlignedVerse], vocab: PairVocab, settings: PairSettings
    ):
        super().__init__()
        self.train, self.val, self.vocab, self.settings = train, val, vocab, settings

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        seed = self.settings.seed + epoch
        return pair_loader(self.train, self.vocab, seed, self.settings.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return pair_loader(self.val, self.vocab, self.settings.seed)


class EpochLog(pl.Callback):
    """Prints the validation figures after every epoch (the Trainer's progress bar and logger are off)."""

    def __init__(self, log: Callable[[str], None]):
        self.write = log

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
        self.write(f"pairs: epoch {trainer.current_epoch + 1}/{trainer.max_epochs}: {metrics}")


def train_or_load(
    settings: PairSettings,
    train: Sequence[AlignedVerse],
    val: Sequence[AlignedVerse],
    cache: Optional[Path] = CACHE,
    log: Callable[[str], None] = print,
) -> Tuple[PairAttentionClassifier, PairVocab, bool]:
    """The trained classifier (eval mode), its vocabulary, and whether it came from the cache."""
    train = list(train)[: settings.train_verses] if settings.train_verses else list(train)
    vocab = PairVocab([v.source for v in train] + [v.target for v in train], settings.min_count)
    path = None if cache is None else Path(cache) / f"bible_pairs_{settings.key()}.pt"
    pl.seed_everything(settings.seed, verbose=False)
    module = PairAttentionClassifier(
        len(vocab), settings.embedding_dim, settings.hidden_dim, dropout=settings.dropout, lr=settings.lr
    )
    if path is not None and path.exists():
        module.load_state_dict(torch.load(path, map_location="cpu"))
        return module.eval(), vocab, True
    trainer = pl.Trainer(
        max_epochs=settings.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        reload_dataloaders_every_n_epochs=1,
        callbacks=[EpochLog(log)],
    )
    trainer.fit(module, datamodule=FreshNegatives(train, val, vocab, settings))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(module.state_dict(), path)
    return module.eval(), vocab, False

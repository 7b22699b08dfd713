"""Bundled real datasets and the one data module that serves them."""
from lightning_xai.data.datamodule import TextClassificationDataModule, collate
from lightning_xai.data.hf import HFTextClassificationDataModule, WordPieceCollator
from lightning_xai.data.masking import MaskedDataModule, MaskedDataset
from lightning_xai.data.readers import DATASET_SPLITS, Example, read_split, read_user_file
from lightning_xai.data.vocabulary import Vocabulary

__all__ = ["DATASET_SPLITS", "Example", "HFTextClassificationDataModule", "MaskedDataModule", "MaskedDataset",
           "TextClassificationDataModule", "Vocabulary", "WordPieceCollator", "collate", "read_split", "read_user_file"]

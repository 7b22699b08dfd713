"""Bundled real datasets and the one data module that serves them; the bundled word-aligned parallel corpus."""

from lightning_xai.data.alignments import ALIGNMENT_SPLITS, AlignedVerse, read_alignments
from lightning_xai.data.datamodule import TextClassificationDataModule, collate
from lightning_xai.data.hf import HFTextClassificationDataModule, WordPieceCollator
from lightning_xai.data.masking import MaskedDataModule, MaskedDataset
from lightning_xai.data.readers import DATASET_SPLITS, Example, read_split, read_user_file
from lightning_xai.data.vocabulary import Vocabulary

__all__ = [
    "ALIGNMENT_SPLITS",
    "AlignedVerse",
    "DATASET_SPLITS",
    "Example",
    "HFTextClassificationDataModule",
    "MaskedDataModule",
    "MaskedDataset",
    "TextClassificationDataModule",
    "Vocabulary",
    "WordPieceCollator",
    "collate",
    "read_alignments",
    "read_split",
    "read_user_file",
]

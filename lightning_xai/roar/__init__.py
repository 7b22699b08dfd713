"""Remove-and-retrain (Hooker et al. 2019): rank tokens with a base model, mask them everywhere, retrain, test."""

from lightning_xai.roar.procedure import DEFAULT_FRACTIONS, RoarResult, rank_split, remove_and_retrain, roar_positions

__all__ = ["DEFAULT_FRACTIONS", "RoarResult", "rank_split", "remove_and_retrain", "roar_positions"]

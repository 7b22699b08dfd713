"""Remove-and-retrain (Hooker et al. 2019) for text classifiers, as a Lightning procedure.

For each ranking (``attention``, ``gradient``, ``integrated_gradients``, ``leave_one_out``, ``random`` or any
method :func:`~lightning_xai.attribution.attribute` knows) computed **once, by the base model**, and each fraction
f, the top ``ceil(f · n)`` real tokens of every train/val/test example are masked
(:class:`~lightning_xai.data.masking.MaskedDataModule`), a *fresh* model is trained on the masked training split
and its accuracy on the masked test split is recorded. A ranking whose curve falls below ``random``'s removes
information the task needs; because every model is trained on masked inputs, the drop is not the
out-of-distribution artefact that plain erasure suffers from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from lightning_xai.attribution import attribute
from lightning_xai.data.datamodule import SPLITS, collate
from lightning_xai.data.masking import MASK_MODES, MaskedDataModule, top_positions

__all__ = ["DEFAULT_FRACTIONS", "RoarResult", "rank_split", "remove_and_retrain", "roar_positions"]

DEFAULT_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
_TRAINER_DEFAULTS = dict(
    max_epochs=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    deterministic=True,
)


@dataclass
class RoarResult:
    """Accuracies of remove-and-retrain.

    Attributes:
        base_accuracy: ``{seed: test accuracy}`` of models trained on the unmasked data (fraction 0).
        accuracy: ``{ranking: {fraction: {seed: test accuracy of the retrained model}}}``.
        positions: ``{ranking: {fraction: {split: per-example masked positions}}}`` (what was removed).
    """

    base_accuracy: Dict[int, float] = field(default_factory=dict)
    accuracy: Dict[str, Dict[float, Dict[int, float]]] = field(default_factory=dict)
    positions: Dict[str, Dict[float, Dict[str, List[List[int]]]]] = field(default_factory=dict)

    def mean(self, ranking: str, fraction: float) -> float:
        """Mean test accuracy over seeds (fraction 0: the unmasked models)."""
        values = self.base_accuracy if fraction == 0 else self.accuracy[ranking][fraction]
        return sum(values.values()) / len(values)

    def table(self) -> str:
        """A Markdown table: one row per ranking, one column per fraction (mean over seeds)."""
        fractions = sorted({f for per in self.accuracy.values() for f in per})
        head = "| ranking | 0% | " + " | ".join(f"{f:.0%}" for f in fractions) + " |"
        rule = "|---" * (len(fractions) + 2) + "|"
        rows = [
            f"| {name} | {self.mean(name, 0):.3f} | "
            + " | ".join(f"{self.mean(name, f):.3f}" for f in fractions)
            + " |"
            for name in self.accuracy
        ]
        return "\n".join([head, rule, *rows])


def rank_split(
    model: Any,
    dataset: Any,
    method: str,
    *,
    batch_size: int = 64,
    seed: int = 0,
    method_options: Optional[Mapping[str, Any]] = None,
) -> List[List[float]]:
    """Per example of ``dataset`` (in order), the ``method`` scores of ``model`` at each of its positions.

    Non-token positions get ``-inf``; ``"random"`` draws uniform scores from a generator seeded with ``seed``.
    Scores are ranked by value (signed methods: the most positive first; the built-in gradient, attention and
    leave-one-out maps are non-negative by default).
    """
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate)
    out: List[List[float]] = []
    for batch in loader:
        mask = batch["mask"]
        if method == "random":
            scores = torch.rand(mask.shape, generator=generator, dtype=torch.float64)
        else:
            maps = attribute(model, batch, method, **dict(method_options or {}))
            scores = maps[0] if isinstance(maps, tuple) else maps
        scores = scores.detach().double().masked_fill(~mask, float("-inf"))
        lengths = batch.get("input_mask", mask).sum(1).tolist()
        out.extend(row[:length] for row, length in zip(scores.tolist(), lengths))
    return out


def roar_positions(scores: Sequence[Sequence[float]], dataset: Any, fraction: float) -> List[List[int]]:
    """Per example, the positions :func:`~lightning_xai.data.masking.top_positions` masks at ``fraction``."""
    return [top_positions(row, dataset[i]["mask"], fraction) for i, row in enumerate(scores)]


def _fit_and_test(
    make_model: Callable[[], pl.LightningModule],
    datamodule: Any,
    seed: int,
    trainer_kwargs: Mapping[str, Any],
    metric: str,
) -> tuple:
    pl.seed_everything(seed, workers=True, verbose=False)
    model = make_model()
    trainer = pl.Trainer(**{**_TRAINER_DEFAULTS, **trainer_kwargs})
    trainer.fit(model, datamodule=datamodule)
    results = trainer.test(model, datamodule=datamodule, verbose=False)
    if not results or metric not in results[0]:
        raise KeyError(
            f"trainer.test logged no {metric!r} (logged: {sorted(results[0]) if results else []}); pass "
            "metric= the test accuracy key your model logs."
        )
    return model.eval(), float(results[0][metric])


def remove_and_retrain(
    datamodule: Any,
    make_model: Callable[[], pl.LightningModule],
    *,
    rankings: Sequence[str] = ("attention", "gradient", "leave_one_out", "random"),
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seeds: Sequence[int] = (0,),
    trainer_kwargs: Optional[Mapping[str, Any]] = None,
    mode: str = "unk",
    base_model: Optional[pl.LightningModule] = None,
    method_options: Optional[Mapping[str, Mapping[str, Any]]] = None,
    metric: str = "test/acc",
    ranking_batch_size: int = 64,
    on_result: Optional[Callable[[str, float, int, float], None]] = None,
) -> RoarResult:
    """Run remove-and-retrain and return the accuracy of every retrained model.

    Args:
        datamodule: a :class:`~lightning_xai.data.TextClassificationDataModule` (train, val and test splits).
        make_model: builds a fresh, untrained model (called after seeding, once per training run).
        rankings: attribution methods (``"random"`` included) whose base-model maps decide what is masked.
        fractions: shares of each example's real tokens to mask, each in (0, 1).
        seeds: one retrained model per seed and (ranking, fraction); the seed also fixes ``"random"``.
        trainer_kwargs: overrides of the Trainer settings (defaults: 1 epoch, no logger/checkpoints, deterministic).
        mode: ``"unk"`` (masked words become ``<unk>``) or ``"delete"``.
        base_model: a trained model whose maps rank the tokens; default: the seed-``seeds[0]`` model trained on the
            unmasked data here.
        method_options: per-ranking options for :func:`~lightning_xai.attribution.attribute`.
        metric: the test accuracy key the model logs.
        ranking_batch_size: examples per attribution call.
        on_result: called as ``on_result(ranking, fraction, seed, accuracy)`` after each retrained model.

    Example:
        >>> from lightning_xai.data import TextClassificationDataModule
        >>> from lightning_xai.models import AttentionClassifier
        >>> dm = TextClassificationDataModule("sst2", batch_size=64)
        >>> make = lambda: AttentionClassifier(dm.vocab_size, 2, embedding_dim=8, hidden_dim=4)
        >>> quick = {"max_steps": 2, "limit_val_batches": 1, "limit_test_batches": 2}
        >>> result = remove_and_retrain(dm, make, rankings=("random",), fractions=(0.5,), trainer_kwargs=quick)
        >>> sorted(result.accuracy["random"])
        [0.5]
    """
    if mode not in MASK_MODES:
        raise ValueError(f"mode must be one of {MASK_MODES}, got {mode!r}.")
    if not rankings or not seeds:
        raise ValueError("remove_and_retrain needs at least one ranking and one seed.")
    bad = [f for f in fractions if not (isinstance(f, (int, float)) and 0 < f < 1 and math.isfinite(f))]
    if bad or not fractions:
        raise ValueError(f"fractions must be numbers in (0, 1); got {list(fractions)}.")
    trainer_kwargs = dict(trainer_kwargs or {})
    result = RoarResult()
    datamodule.setup("fit")
    for seed in seeds:
        model, accuracy = _fit_and_test(make_model, datamodule, seed, trainer_kwargs, metric)
        result.base_accuracy[seed] = accuracy
        if base_model is None and seed == seeds[0]:
            base_model = model
    assert base_model is not None  # seeds is not empty: the default is the seeds[0] model
    base_model.eval()
    datasets = {split: datamodule.dataset(split) for split in SPLITS}
    for name in rankings:
        options = (method_options or {}).get(name, {})
        result.accuracy[name], result.positions[name] = {}, {}
        for seed in seeds if name == "random" else seeds[:1]:
            scores = {
                split: rank_split(
                    base_model, data, name, batch_size=ranking_batch_size, seed=seed, method_options=options
                )
                for split, data in datasets.items()
            }
            for fraction in fractions:
                positions = {split: roar_positions(scores[split], datasets[split], fraction) for split in SPLITS}
                result.positions[name].setdefault(fraction, positions)
                masked = MaskedDataModule(datamodule, positions, mode)
                for run_seed in (seed,) if name == "random" else seeds:
                    _, accuracy = _fit_and_test(make_model, masked, run_seed, trainer_kwargs, metric)
                    result.accuracy[name].setdefault(fraction, {})[run_seed] = accuracy
                    if on_result is not None:
                        on_result(name, fraction, run_seed, accuracy)
    return result

"""The training's own logged metrics (loss, accuracy, ``val/*``) and the audit metrics, as panels on one epoch axis.

:class:`TrainingLog` keeps one record per epoch of ``trainer.callback_metrics`` (scalars only, audit keys left
out), so the curves need no logger at all — not W&B, not CSV. The panel builders turn those records and the audits'
histories into :data:`~lightning_xai.reporting.plots.Panel` s for
:func:`~lightning_xai.reporting.plots.plot_panels`.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from lightning_xai.reporting.plots import Panel

__all__ = ["TrainingLog", "split_stage", "training_panels", "audit_panels", "erasure_panels", "agreement_panels"]

#: the stage words a training metric's name starts with, longest first (``validation_loss`` is not ``val`` + ``idation``)
_STAGES = ("training", "train", "validation", "valid", "val", "test")
_PAIR = re.compile(r"^(?P<metric>[^/]+)/(?P<pair>[^/]+_vs_[^/]+)$")
_ERASURE = (
    "comprehensiveness",
    "sufficiency",
    "flipped",
    "fraction_removed",
    "attention_removed",
    "aopc_comprehensiveness",
    "aopc_sufficiency",
)


def _scalar(value: Any) -> Optional[float]:
    if hasattr(value, "numel"):
        if value.numel() != 1:
            return None
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class TrainingLog:
    """One record per epoch of the scalars in ``trainer.callback_metrics`` (audit keys and ``*_step`` left out).

    Records look like the audits' (``stage`` ``"fit"``, ``epoch``, ``global_step``, ``metrics``), so the same
    plots read both. A later capture of the same epoch updates it (epoch means of ``train/*`` are only in
    ``callback_metrics`` once the epoch has ended).

    Example:
        >>> log = TrainingLog()
        >>> log.capture({"train/loss": 0.7, "val/acc": 0.5, "xai/tau": 0.3, "train/loss_step": 0.6}, 0, 10,
        ...             exclude=("xai/",))
        >>> log.capture({"train/loss": 0.6}, 0, 10)
        >>> log.records
        [{'stage': 'fit', 'epoch': 0, 'global_step': 10, 'metrics': {'train/loss': 0.6, 'val/acc': 0.5}}]
    """

    def __init__(self) -> None:
        self.records: List[Dict[str, Any]] = []

    def capture(self, metrics: Mapping[str, Any], epoch: int, step: int, exclude: Sequence[str] = ()) -> None:
        """Add (or update) the record of ``epoch`` with the scalar ``metrics``."""
        values: Dict[str, float] = {}
        for key, value in metrics.items():
            number = _scalar(value)
            if number is None or key.endswith("_step") or any(key.startswith(p) for p in exclude):
                continue
            values[key] = number
        if not values:
            return
        record = next((r for r in self.records if r["epoch"] == epoch), None)
        if record is None:
            record = {"stage": "fit", "epoch": int(epoch), "global_step": int(step), "metrics": {}}
            self.records.append(record)
            self.records.sort(key=lambda r: r["epoch"])
        record["global_step"] = max(record["global_step"], int(step))
        record["metrics"].update(values)

    def state_dict(self) -> Dict[str, Any]:
        return {"records": [dict(r, metrics=dict(r["metrics"])) for r in self.records]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the records of a checkpoint; epochs this log already holds are kept (testing from the best
        checkpoint right after fitting must not drop the epochs after it)."""
        held = {r["epoch"] for r in self.records}
        self.records.extend(
            dict(r, metrics=dict(r["metrics"])) for r in state.get("records", []) if r["epoch"] not in held
        )
        self.records.sort(key=lambda r: r["epoch"])


def split_stage(key: str) -> Tuple[Optional[str], str]:
    """``(stage, quantity)`` of a training metric's name, in the spellings Lightning users log: ``train/loss``,
    ``train_loss``, ``val_acc``, ``valid/f1``, ``validation_loss``, ``test/acc`` (``_epoch`` dropped); the stage
    is ``None`` for a name without one.

    Example:
        >>> [split_stage(k) for k in ("train_loss", "val/acc_epoch", "validation_loss", "lr")]
        [('train', 'loss'), ('val', 'acc'), ('validation', 'loss'), (None, 'lr')]
    """
    stage = None
    for word in _STAGES:
        if key.startswith((word + "/", word + "_")) and len(key) > len(word) + 1:
            stage, key = word, key[len(word) + 1 :]
            break
    return stage, key[: -len("_epoch")] if key.endswith("_epoch") else key


def _base(key: str) -> str:
    return split_stage(key)[1]


def training_panels(records: Sequence[Mapping[str, Any]]) -> List[Panel]:
    """One panel per logged quantity, its train and val series together (``train/loss`` with ``val/loss``).

    Example:
        >>> rec = [{"epoch": 0, "metrics": {"train/loss_epoch": 0.7, "val/loss": 0.69, "val/acc": 0.5}}]
        >>> [(title, names) for title, _, names, _ in training_panels(rec)]
        [('loss', ['train/loss_epoch', 'val/loss']), ('acc', ['val/acc'])]
    """
    groups: Dict[str, List[str]] = {}
    for record in records:
        for key in record["metrics"]:
            if key not in groups.get(_base(key), []):
                groups.setdefault(_base(key), []).append(key)
    order = sorted(groups, key=lambda g: 0 if "loss" in g else 1 if "acc" in g else 2)
    return [(group, records, groups[group], group) for group in order]


def _keys(history: Sequence[Mapping[str, Any]]) -> List[str]:
    keys: List[str] = []
    for record in history:
        for key in record["metrics"]:
            name = key[: -len("/mean")] if key.endswith("/mean") else None
            if name and name not in keys:
                keys.append(name)
    return keys


def agreement_panels(history: Sequence[Mapping[str, Any]], prefix: str) -> Dict[str, List[Panel]]:
    """Per agreement metric, one panel per pair of maps (``kendall_tau/attention_vs_gradient``): small multiples,
    so the ±std bands of different pairs never overlap."""
    fit = [r for r in history if r.get("stage") == "fit"]
    out: Dict[str, List[Panel]] = {}
    for name in _keys(fit):
        match = _PAIR.match(name)
        if match:
            pair = match["pair"].replace("_vs_", " ↔ ")
            out.setdefault(match["metric"], []).append((f"{prefix}: {pair}", fit, [name], match["metric"]))
    return out


def erasure_panels(history: Sequence[Mapping[str, Any]]) -> List[Panel]:
    """One panel per erasure measure, every ranking on it (attention vs random vs saliency on one axis)."""
    fit = [r for r in history if r.get("stage") == "fit"]
    by_measure: Dict[str, List[str]] = {}
    for name in _keys(fit):
        ranking, _, measure = name.rpartition("/")
        if ranking and measure in _ERASURE:
            by_measure.setdefault(measure, []).append(name)
    return [(f"{m.replace('_', ' ')}: every ranking", fit, by_measure[m], m) for m in _ERASURE if m in by_measure]


def audit_panels(audits: Sequence[Any]) -> List[Panel]:
    """The audit metrics read beside the training curves: attention ↔ each method (first agreement metric,
    one panel) and comprehensiveness (or decision flips) of every ranking (one panel)."""
    panels: List[Panel] = []
    for audit in audits:
        history = [r for r in getattr(audit, "history", []) if r.get("stage") == "fit"]
        agreement = agreement_panels(history, audit.log_prefix)
        if agreement:
            preferred = [m for m in getattr(audit, "metrics", ()) or () if m in agreement]
            metric = (preferred or list(agreement))[0]
            pairs = [names[0] for _, _, names, _ in agreement[metric] if "attention_vs_" in names[0]]
            if pairs:
                panels.append((f"{metric}: attention ↔ each method", history, pairs, metric))
        erasure = erasure_panels(history)
        for title, records, names, measure in erasure:
            if measure in ("comprehensiveness", "flipped"):
                panels.append((title, records, names, measure))
                break
    return panels

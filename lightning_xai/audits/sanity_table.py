"""The tidy result of every sanity check, :class:`SanityTable`, and the helpers the checks share."""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from torch import Tensor

from lightning_xai.adapters.protocol import Batch
from lightning_xai.attribution import attribute

__all__ = ["MethodSpec", "SanityTable"]

MethodSpec = Union[str, Tuple[str, str, Mapping[str, Any]]]
"""A method name, or ``(label, method, options)`` to run one method with several option sets."""


@dataclass
class SanityTable:
    """Result of a sanity check: a tidy table, one row per (method[, stage]).

    Attributes:
        check: the check's name.
        rows: one dict per row; every row has the same keys (``columns``).
        notes: how to read the table (thresholds, what passing means).
        per_example: ``{key: [B] tensor}`` the per-example values behind the rows (keys like
            ``"gradient/relative_change"`` or ``"cascading/encoder/lrp/tau"``), for callbacks that aggregate
            many batches.

    Example:
        >>> table = SanityTable("demo", [{"method": "gradient", "passes": True}])
        >>> print(table.to_markdown())
        | method | passes |
        |---|---|
        | gradient | True |
        >>> table.row(method="gradient")["passes"]
        True
    """

    check: str
    rows: List[Dict[str, Any]]
    notes: str = ""
    columns: List[str] = field(default_factory=list)
    per_example: Dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.columns:
            seen: Dict[str, None] = {}
            for row in self.rows:
                for key in row:
                    seen.setdefault(key, None)
            self.columns = list(seen)

    def column(self, name: str) -> List[Any]:
        """The values of one column, in row order."""
        if name not in self.columns:
            raise KeyError(f"No column {name!r}; columns: {self.columns}.")
        return [row.get(name) for row in self.rows]

    def row(self, **match: Any) -> Dict[str, Any]:
        """The single row whose values equal ``match`` (e.g. ``row(method="gradient", stage="encoder")``)."""
        found = [row for row in self.rows if all(row.get(k) == v for k, v in match.items())]
        if len(found) != 1:
            raise KeyError(
                f"{len(found)} rows of {self.check!r} match {match}; rows: "
                f"{[{c: r.get(c) for c in self.columns[:2]} for r in self.rows]}."
            )
        return found[0]

    def to_markdown(self, digits: int = 3) -> str:
        """A GitHub-flavoured markdown table (floats rounded to ``digits``)."""

        def fmt(value: Any) -> str:
            if isinstance(value, float):
                return (
                    "nan"
                    if math.isnan(value)
                    else f"{value:.{digits}g}"
                    if abs(value) < 1e-3 and value
                    else f"{value:.{digits}f}"
                )
            return str(value)

        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(fmt(row.get(c)) for c in self.columns) + " |" for row in self.rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        return f"{self.check}\n{self.to_markdown()}" + (f"\n{self.notes}" if self.notes else "")


def _slug(label: str) -> str:
    return "_".join(label.replace("(", " ").replace(")", " ").replace("+", "").split())


def _specs(methods: Iterable[MethodSpec]) -> List[Tuple[str, str, Dict[str, Any]]]:
    out: List[Tuple[str, str, Dict[str, Any]]] = []
    for spec in methods:
        if isinstance(spec, str):
            out.append((spec, spec, {}))
        elif isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[0], str) and isinstance(spec[2], Mapping):
            out.append((spec[0], spec[1], dict(spec[2])))
        else:
            raise TypeError(f"A method must be a name or a (label, method, options) triple; got {spec!r}.")
    if not out:
        raise ValueError("No methods given; pass method names such as 'gradient' or 'grad_x_input'.")
    return out


def _copy_model(model: Any) -> Any:
    """A deep copy that does not drag a Lightning Trainer along."""
    trainer = getattr(model, "_trainer", None)
    if trainer is not None:
        model._trainer = None
    try:
        return copy.deepcopy(model)
    finally:
        if trainer is not None:
            model._trainer = trainer


def _maps(
    model: Any, batch: Batch, specs: Sequence[Tuple[str, str, Dict[str, Any]]], target: Tensor, skip_unsupported: bool
) -> Dict[str, Optional[Tensor]]:
    maps: Dict[str, Optional[Tensor]] = {}
    for label, method, options in specs:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # IG's completeness warning: completeness() reports it
                result = attribute(model, batch, method, target=target, **options)
        except ValueError as error:
            if skip_unsupported and method == "lrp" and "LRP does not support" in str(error):
                maps[label] = None
                continue
            raise
        maps[label] = (result[0] if isinstance(result, tuple) else result).detach()
    return maps


def _relative_change(before: Tensor, after: Tensor, mask: Tensor) -> Tuple[float, float, Tensor]:
    diff = ((after - before) * mask).double()
    base = (before * mask).double()
    per_row = diff.norm(dim=1) / base.norm(dim=1).clamp_min(1e-30)
    return float(diff.abs().max()), float(diff.norm() / base.norm().clamp_min(1e-30)), per_row

"""From per-example values to the logged scalars, with the torchmetrics classes: mean, std, significant fraction.

Each per-example value ``name`` (with its ``name/p_value`` when there is one) is averaged by a
:class:`~lightning_xai.metrics.ValueMean` — NaN instances left out — so under DDP each process feeds its own
shard and torchmetrics syncs the sum states; :func:`~lightning_xai.metrics.summarize_values` is the same code
in one call.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from lightning_xai.callbacks._audit.results import AuditExample, BatchResult, collect_examples
from lightning_xai.metrics._base import ValueMean, summarize_values

__all__ = ["AuditCollector", "ValueAggregator", "aggregate_values", "histogram_values", "summarize_values"]

_P = "/p_value"
_FIELDS = ("mean", "std", "significant_fraction")


class ValueAggregator:
    """One :class:`~lightning_xai.metrics.ValueMean` per per-example value, fed batch by batch.

    Args:
        device: where the metric states live (the module's device: a callback's metrics are not child modules,
            and NCCL syncs only CUDA tensors).
        alpha: p-value threshold of ``significant_fraction``.

    Example:
        >>> agg = ValueAggregator()
        >>> agg.update({"tau": torch.tensor([0.2, 0.4]), "tau/p_value": torch.tensor([0.01, 0.5])})
        >>> agg.update({"tau": torch.tensor([float("nan")]), "tau/p_value": torch.tensor([float("nan")])})
        >>> {k: round(v, 6) for k, v in agg.compute().items()}
        {'tau/mean': 0.3, 'tau/std': 0.1, 'tau/significant_fraction': 0.5}
    """

    def __init__(self, device: Optional[torch.device] = None, alpha: float = 0.05) -> None:
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.alpha = alpha
        self._metrics: Dict[str, ValueMean] = {}

    def _metric(self, name: str, has_p: bool) -> ValueMean:
        if name not in self._metrics:
            self._metrics[name] = ValueMean(significance=self.alpha if has_p else None).to(self.device)
        return self._metrics[name]

    def update(self, values: Mapping[str, Tensor]) -> None:
        """Add one batch's ``{name: [B]}`` values (``name/p_value`` entries are the p-values of ``name``)."""
        for name, value in values.items():
            if not name.endswith(_P):
                p_value = values.get(name + _P)
                self._metric(name, p_value is not None).update(
                    value.detach().to(self.device), None if p_value is None else p_value.detach().to(self.device)
                )

    def compute(self, names: Optional[Mapping[str, bool]] = None) -> Dict[str, float]:
        """``name/mean``, ``name/std`` (and ``name/significant_fraction``) for every name, sorted.

        Args:
            names: ``{name: has_p_value}`` to report (default: those updated here). Under DDP pass the names of
                every process (e.g. from the gathered examples): each metric's ``compute()`` is a collective sync,
                so every process must compute the same metrics in the same order.
        """
        if names is None:
            names = {n: m.significance is not None for n, m in self._metrics.items()}
        out: Dict[str, float] = {}
        for name in sorted(names):
            metric = self._metric(name, names[name])
            if not metric.update_called:  # nothing of it on this process's shard
                metric.update(
                    torch.empty(0, dtype=torch.float64),
                    None if metric.significance is None else torch.empty(0, dtype=torch.float64),
                )
            result = metric.compute()
            out.update({f"{name}/{k}": float(result[k]) for k in _FIELDS if k in result})
        return out


def value_names(examples: List[AuditExample]) -> Dict[str, bool]:
    """``{name: has_p_value}`` of the per-example values of ``examples``."""
    names = {k for e in examples for k in e.values if not k.endswith(_P)}
    return {n: any(n + _P in e.values for e in examples) for n in names}


def aggregate_values(examples: List[AuditExample], alpha: float = 0.05) -> Dict[str, float]:
    """``<name>/mean``, ``<name>/std`` and (for values with a ``<name>/p_value``) ``<name>/significant_fraction``
    of every per-example value of ``examples`` (one process; a value an example lacks counts as undefined).

    Example:
        >>> e = [AuditExample(p, p, "val", [], None, 0, 1.0, values={"v": v}) for p, v in enumerate([1.0, 3.0])]
        >>> aggregate_values(e)
        {'v/mean': 2.0, 'v/std': 1.0}
    """
    names = value_names(examples)
    out: Dict[str, float] = {}
    for name in sorted(names):
        p_values = [e.values.get(name + _P, float("nan")) for e in examples] if names[name] else None
        summary = summarize_values([e.values.get(name, float("nan")) for e in examples], p_values, alpha)
        out.update({f"{name}/{k}": summary[k] for k in _FIELDS if k in summary})
    return out


class AuditCollector:
    """What one audit run gathers on this process, batch by batch: its :class:`AuditExample` s, the batches'
    ``extra`` dicts and the :class:`ValueAggregator` of their values.

    Example:
        >>> collected = AuditCollector(split="val", num_report_examples=1)
        >>> found = BatchResult(values={"v": torch.tensor([0.5])}, prediction=torch.tensor([1]),
        ...                     probability=torch.tensor([0.9]))
        >>> collected.add(torch.tensor([[True]]), {}, [0], [7], found, {"a": 1})
        >>> [e.index for e in collected.examples], collected.extras, collected.aggregator.compute()["v/mean"]
        ([7], [{'a': 1}], 0.5)
    """

    def __init__(self, device: Optional[torch.device] = None, *, split: str, num_report_examples: int) -> None:
        self.split, self.num_report_examples = split, num_report_examples
        self.examples: List[AuditExample] = []
        self.extras: List[Dict[str, Any]] = []
        self.aggregator = ValueAggregator(device)

    def add(
        self,
        mask: Tensor,
        batch: Mapping[str, Any],
        positions: Sequence[int],
        indices: Sequence[int],
        found: BatchResult,
        extra: Dict[str, Any],
    ) -> None:
        """One audited batch (see :func:`~lightning_xai.callbacks._audit.results.collect_examples`)."""
        self.aggregator.update(found.values)
        self.examples.extend(
            collect_examples(mask, batch, positions, indices, self.split, found, self.num_report_examples)
        )
        self.extras.append(extra)


def histogram_values(examples: List[AuditExample]) -> List[str]:
    """The per-example values of ``examples`` whose histograms a report draws by default: all but p-values.

    Example:
        >>> histogram_values([AuditExample(0, 0, "val", [], None, 0, 1.0, values={"tau": 0.1, "tau/p_value": 0.2})])
        ['tau']
    """
    keys: List[str] = []
    for example in examples:
        keys.extend(k for k in example.values if k not in keys and not k.endswith(_P))
    return keys

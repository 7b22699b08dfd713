"""Never a silent wrong number: examples whose results are undefined, and metrics undefined for a whole audit.

A row whose logits are NaN or infinite (NaN weights after a diverged step, an overflow) has no prediction: argmax
of NaN is an arbitrary class, and every measurement built on it — a decision flip, a gradient, an accuracy — is
meaningless. The shared prediction step finds such rows (one cheap check per audited batch); their values become
NaN, the example records why (:attr:`~lightning_xai.callbacks.results.AuditExample.undefined`), and every aggregate
leaves it out instead of counting it as "not flipped" or as a wrong prediction. A metric that no example defines
is logged as NaN — never dropped — with a warning saying so.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lightning_xai.attribution.batching import gather_rows
from lightning_xai.callbacks.results import AuditExample

__all__ = ["NONFINITE_LOGITS", "audit_finite_rows", "defined_examples", "mark_undefined", "spread_rows", "keep_rows",
           "warn_undefined"]

#: the cause recorded for rows whose logits are NaN or infinite
NONFINITE_LOGITS = "non-finite logits"


def keep_rows(batch: Mapping[str, Any], rows: Tensor) -> Dict[str, Any]:
    """Only the ``rows`` (``[b]`` indices) of a collated batch, its size read from its first tensor: every tensor
    or list whose first dimension is the batch's is indexed, anything else kept (through
    :func:`~lightning_xai.attribution.batching.gather_rows`).

    Example:
        >>> keep_rows({"input_ids": torch.tensor([[3, 4], [5, 0]]), "ids": ["a", "b"], "n": 2}, torch.tensor([1]))
        {'input_ids': tensor([[5, 0]]), 'ids': ['b'], 'n': 2}
    """
    size = next(v.shape[0] for v in batch.values() if isinstance(v, Tensor) and v.dim())
    return gather_rows(batch, rows, size)


def _spread(value: Tensor, rows: Tensor, size: int) -> Tensor:
    full = torch.full((size, *value.shape[1:]), math.nan, dtype=torch.float64, device=value.device)
    full[rows.to(value.device)] = value.detach().double()
    return full


def spread_rows(found: Mapping[str, Any], rows: Tensor, size: int) -> Dict[str, Any]:
    """An ``audit_batch`` result on the ``rows`` of a batch of ``size`` rows, as a result on the whole batch: its
    ``values``, ``maps`` and row-aligned tensors get NaN at the other rows.

    Example:
        >>> spread_rows({"values": {"v": torch.tensor([0.5])}}, torch.tensor([1]), 2)["values"]["v"].tolist()
        [nan, 0.5]
    """
    out: Dict[str, Any] = {}
    for key, value in found.items():
        if key in ("values", "maps"):
            out[key] = {k: _spread(v, rows, size) for k, v in value.items()}
        elif isinstance(value, Tensor) and value.dim() and value.shape[0] == rows.numel():
            out[key] = _spread(value, rows, size)
        else:
            out[key] = value
    return out


def audit_finite_rows(audit: Callable[[Dict[str, Any], List[int], Optional[Any]], Tuple[Dict[str, Any], Any]],
                      batch: Dict[str, Any], indices: List[int], prediction: Any) -> Tuple[Dict[str, Any], Any]:
    """``audit(batch, indices, prediction)`` on the rows whose logits are finite (normally all of them: one cheap
    check), as a result on the whole batch; the other rows' results are NaN (and the audit never sees them). On a
    part of the batch ``audit`` gets ``prediction=None`` and predicts that part itself.

    Example:
        >>> from types import SimpleNamespace
        >>> audit = lambda batch, indices, prediction: ({"values": {"n": batch["x"].double()}}, {})
        >>> found, _ = audit_finite_rows(audit, {"x": torch.tensor([1, 2])}, [7, 8],
        ...                              SimpleNamespace(finite=torch.tensor([True, False])))
        >>> found["values"]["n"].tolist()
        [1.0, nan]
    """
    finite = prediction.finite.cpu()
    if bool(finite.all()):
        return audit(batch, indices, prediction)
    if not bool(finite.any()):
        return {}, {}
    rows = finite.nonzero().flatten()
    found, extra = audit(keep_rows(batch, rows), [indices[i] for i in rows.tolist()], None)
    return spread_rows(found, rows, len(indices)), extra


def mark_undefined(found: Dict[str, Any], finite: Tensor, names: Sequence[str] = ()) -> Dict[str, Any]:
    """``found`` (an audited batch's results) with the values of the rows where ``finite`` is False set to NaN
    (also for the value ``names`` the audit always reports, so a metric no example defines is still reported)
    and ``found["undefined"]`` = ``{row: cause}``.

    Example:
        >>> found = {"values": {"flipped": torch.tensor([0.0, 1.0])}}
        >>> out = mark_undefined(found, torch.tensor([False, True]))
        >>> out["values"]["flipped"].tolist(), out["undefined"]
        ([nan, 1.0], {0: 'non-finite logits'})
    """
    bad = ~finite.detach().cpu()
    if not bool(bad.any()):
        return found
    values = {name: torch.full(bad.shape, math.nan, dtype=torch.float64) for name in names}
    for name, value in found.get("values", {}).items():
        value = value.detach().double()
        values[name] = value.masked_fill(bad.to(value.device), math.nan)
    rows = bad.nonzero().flatten().tolist()
    return {**found, "values": values, "undefined": {row: NONFINITE_LOGITS for row in rows}}


def defined_examples(examples: List[AuditExample]) -> List[AuditExample]:
    """The examples whose results are defined (see :func:`mark_undefined`).

    Example:
        >>> e = [AuditExample(0, 0, "val", [], 1, 0, 0.5), AuditExample(1, 1, "val", [], 1, 0, math.nan,
        ...      undefined=NONFINITE_LOGITS)]
        >>> [x.position for x in defined_examples(e)]
        [0]
    """
    return [e for e in examples if e.undefined is None]


def warn_undefined(owner: str, split: str, examples: List[AuditExample], metrics: Mapping[str, Any],
                   warned: Set[str]) -> None:
    """Warn (rank zero) about undefined examples of this audit and about metrics NaN for the whole audit.

    ``warned`` holds the metric keys already warned about (each is named once per callback, not at every audit).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_undefined("ErasureAudit", "val", [], {"attention/flipped/mean": math.nan}, set())
        >>> "attention/flipped/mean" in str(caught[0].message)
        True
    """
    bad = [e for e in examples if e.undefined is not None]
    if bad:
        causes = sorted({e.undefined for e in bad})
        shown = ", ".join(str(e.index) for e in bad[:8]) + (", ..." if len(bad) > 8 else "")
        rank_zero_warn(f"{owner}: {len(bad)} of {len(examples)} audited {split!r} examples have undefined results "
                       f"({', '.join(causes)}; dataset indices {shown}): their values are NaN and left out of "
                       "every aggregate, not counted as unflipped or wrong. Check the model's weights for NaN (a "
                       "diverged step? try gradient clipping or a lower learning rate) and its inputs.")
    nan = sorted(k for k, v in metrics.items() if isinstance(v, float) and math.isnan(v) and k not in warned)
    if nan:
        warned.update(nan)
        shown = ", ".join(nan[:8]) + (f" and {len(nan) - 8} more" if len(nan) > 8 else "")
        rank_zero_warn(f"{owner}: {shown} undefined for the whole {split!r} audit (no audited example gives a "
                       "defined value: e.g. no decision flipped, constant maps, one-token texts, non-finite "
                       "logits); logged as NaN.")

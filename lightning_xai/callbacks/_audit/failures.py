"""What goes wrong inside an audit, and what the audit does then: never a crashed training run, never a silent wrong
number.

*A failing audit* is reported and skipped (:class:`AuditFailures`), never the end of training, unless the callback
is ``strict``. Under DDP a failure on some processes only (e.g. out of memory on one GPU) is shared before the
audit's gather (:func:`~lightning_xai.callbacks._audit.distributed.shared_failure`), so every process skips the
audit (or raises).

*Undefined results*: a row whose logits are NaN or infinite (NaN weights after a diverged step, an overflow) has no
prediction: argmax of NaN is an arbitrary class, and every measurement built on it — a decision flip, a gradient,
an accuracy — is meaningless. The shared prediction step finds such rows (one cheap check per audited batch);
their values become NaN, the example records why (:attr:`~lightning_xai.callbacks.AuditExample.undefined`), and
every aggregate leaves it out instead of counting it as "not flipped" or as a wrong prediction. A metric that no
example defines is logged as NaN — never dropped — with a warning saying so.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from pytorch_lightning.utilities.rank_zero import rank_zero_debug, rank_zero_warn
from torch import Tensor

from lightning_xai.adapters.protocol import ProtocolError
from lightning_xai.adapters.sharding import agree
from lightning_xai.attribution.batching import gather_rows
from lightning_xai.callbacks._audit.results import AuditExample, BatchResult

__all__ = [
    "AuditFailures",
    "NONFINITE_LOGITS",
    "audit_finite_rows",
    "defined_examples",
    "failure_fix",
    "mark_undefined",
    "with_prediction",
    "spread_rows",
    "keep_rows",
    "warn_undefined",
]


def failure_fix(err: BaseException) -> str:
    """What to try for an exception raised inside an audit.

    Example:
        >>> failure_fix(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))[:40]
        'the audit ran out of memory: lower the c'
    """
    text = str(err).lower()
    if "out of memory" in text or type(err).__name__ == "OutOfMemoryError":
        return (
            "the audit ran out of memory: lower the callback's batch_size= (by default consecutive batches are "
            "joined up to 8,192 tokens, more for a model smaller than MiniLM) or num_samples="
        )
    if isinstance(err, ProtocolError):
        return "the model (or its adapter) does not give what the audit reads: fix the adapter's arguments"
    if isinstance(err, MisconfigurationException):
        return "fix the configuration named above"
    return "rerun with strict=True to get the full traceback"


class AuditFailures:
    """Report an exception raised inside an audit once per exception type, or re-raise it when ``strict``.

    Args:
        owner: the callback's class name (starts every message).
        strict: re-raise instead of reporting.

    Example:
        >>> failures = AuditFailures("AttentionAudit", strict=False)
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     failures.report(ValueError("bad"), "fit", "val", epoch=0, step=10)
        ...     failures.report(ValueError("worse"), "fit", "val", epoch=1, step=20)   # same type: not repeated
        >>> len(caught), failures.count
        (1, 2)
        >>> AuditFailures("AttentionAudit", strict=True).report(ValueError("bad"), "fit", "val", 0, 10)
        Traceback (most recent call last):
        ...
        ValueError: bad
    """

    def __init__(self, owner: str, strict: bool) -> None:
        self.owner = owner
        self.strict = strict
        self.count = 0
        self._reported: Set[type] = set()

    def report(self, err: Exception, stage: str, split: str, epoch: Optional[int], step: Optional[int]) -> None:
        """Re-raise ``err`` when ``strict``; else warn (first time for its type) that the audit was skipped."""
        if self.strict:
            raise err
        self.count += 1
        where = f"the {stage} audit of the {split!r} split at epoch {epoch}, step {step}"
        if type(err) in self._reported:
            rank_zero_debug(f"{self.owner}: {where} failed again ({type(err).__name__}: {err}); skipped.")
            return
        self._reported.add(type(err))
        frames = traceback.extract_tb(err.__traceback__)
        origin = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        rank_zero_warn(
            f"{self.owner}: {where} failed with {type(err).__name__}: {err}{origin}. The audit was "
            f"skipped and training continues; later {type(err).__name__}s of this callback are not "
            f"reported again. Fix: {failure_fix(err)}. Pass strict=True to raise instead."
        )


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


def spread_rows(found: BatchResult, rows: Tensor, size: int) -> BatchResult:
    """An ``audit_batch`` result on the ``rows`` of a batch of ``size`` rows, as a result on the whole batch: its
    ``values``, ``maps`` and row-aligned tensors get NaN at the other rows (a generator's ``step_mask``: no step).

    Example:
        >>> spread_rows(BatchResult(values={"v": torch.tensor([0.5])}), torch.tensor([1]), 2).values["v"].tolist()
        [nan, 0.5]
    """

    def spread(value: Any) -> Any:
        aligned = isinstance(value, Tensor) and value.dim() and value.shape[0] == rows.numel()
        return _spread(value, rows, size) if aligned else value

    steps = found.step_mask
    if steps is not None:  # a generator's shown steps: none at the other rows
        steps = steps.new_zeros((size, *steps.shape[1:])).index_put_((rows.to(steps.device),), steps.bool())
    return dataclasses.replace(
        found,
        values={k: _spread(v, rows, size) for k, v in found.values.items()},
        maps={k: _spread(v, rows, size) for k, v in found.maps.items()},
        prediction=spread(found.prediction),
        probability=spread(found.probability),
        interactions=spread(found.interactions),
        step_maps={k: _spread(v, rows, size) for k, v in found.step_maps.items()},
        step_mask=steps,
    )


def _batch_result(result: Tuple[Any, Dict[str, Any]]) -> Tuple[BatchResult, Dict[str, Any]]:
    found, extra = result
    if not isinstance(found, BatchResult):
        raise TypeError(
            f"audit_batch returned a {type(found).__name__} where it returns (BatchResult, extra): build "
            "lightning_xai.callbacks.BatchResult(maps={name: [B, T]}, values={name: [B]})."
        )
    return found, extra


def audit_finite_rows(
    audit: Callable[[Dict[str, Any], List[int], Optional[Any]], Tuple[BatchResult, Any]],
    batch: Dict[str, Any],
    indices: List[int],
    prediction: Any,
) -> Tuple[BatchResult, Any]:
    """``audit(batch, indices, prediction)`` on the rows whose logits are finite (normally all of them: one cheap
    check), as a result on the whole batch; the other rows' results are NaN (and the audit never sees them). On a
    part of the batch ``audit`` gets ``prediction=None`` and predicts that part itself. A result that is not a
    :class:`~lightning_xai.callbacks.BatchResult` is a ``TypeError`` saying what to return.

    Example:
        >>> from types import SimpleNamespace
        >>> audit = lambda batch, indices, prediction: (BatchResult(values={"n": batch["x"].double()}), {})
        >>> found, _ = audit_finite_rows(audit, {"x": torch.tensor([1, 2])}, [7, 8],
        ...                              SimpleNamespace(finite=torch.tensor([True, False])))
        >>> found.values["n"].tolist()
        [1.0, nan]
    """
    finite = agree(prediction.finite).cpu()  # a sharded model: process 0's rows on every process (lockstep)
    if bool(finite.all()):
        return _batch_result(audit(batch, indices, prediction))
    if not bool(finite.any()):
        return BatchResult(), {}
    rows = finite.nonzero().flatten()
    found, extra = _batch_result(audit(keep_rows(batch, rows), [indices[i] for i in rows.tolist()], None))
    return spread_rows(found, rows, len(indices)), extra


def mark_undefined(found: BatchResult, finite: Tensor, names: Sequence[str] = ()) -> BatchResult:
    """``found`` (an audited batch's results) with the values of the rows where ``finite`` is False set to NaN
    (also for the value ``names`` the audit always reports, so a metric no example defines is still reported)
    and ``undefined`` = ``{row: cause}``.

    Example:
        >>> found = BatchResult(values={"flipped": torch.tensor([0.0, 1.0])})
        >>> out = mark_undefined(found, torch.tensor([False, True]))
        >>> out.values["flipped"].tolist(), out.undefined
        ([nan, 1.0], {0: 'non-finite logits'})
    """
    bad = ~finite.detach().cpu()
    if not bool(bad.any()):
        return found
    values = {name: torch.full(bad.shape, math.nan, dtype=torch.float64) for name in names}
    for name, value in found.values.items():
        value = value.detach().double()
        values[name] = value.masked_fill(bad.to(value.device), math.nan)
    rows = bad.nonzero().flatten().tolist()
    return dataclasses.replace(found, values=values, undefined={row: NONFINITE_LOGITS for row in rows})


def with_prediction(found: BatchResult, prediction: Any, names: Sequence[str] = ()) -> BatchResult:
    """``found`` with the shared prediction step's ``prediction`` and ``probability`` (an
    :class:`~lightning_xai.callbacks.AuditPrediction`) where the audit set none, the rows whose logits are not finite
    marked undefined (:func:`mark_undefined`, with the value ``names`` the audit always reports).

    Example:
        >>> from types import SimpleNamespace
        >>> step = SimpleNamespace(prediction=torch.tensor([1]), probability=torch.tensor([0.9]),
        ...                        finite=torch.tensor([True]))
        >>> out = with_prediction(BatchResult(values={"v": torch.tensor([0.5])}), step)
        >>> out.prediction.tolist(), out.undefined
        ([1], {})
    """
    found = dataclasses.replace(
        found,
        prediction=prediction.prediction if found.prediction is None else found.prediction,
        probability=prediction.probability if found.probability is None else found.probability,
    )
    return mark_undefined(found, prediction.finite, names)


def defined_examples(examples: List[AuditExample]) -> List[AuditExample]:
    """The examples whose results are defined (see :func:`mark_undefined`).

    Example:
        >>> e = [AuditExample(0, 0, "val", [], 1, 0, 0.5), AuditExample(1, 1, "val", [], 1, 0, math.nan,
        ...      undefined=NONFINITE_LOGITS)]
        >>> [x.position for x in defined_examples(e)]
        [0]
    """
    return [e for e in examples if e.undefined is None]


def warn_undefined(
    owner: str, split: str, examples: List[AuditExample], metrics: Mapping[str, Any], warned: Set[str]
) -> None:
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
        causes = sorted({e.undefined for e in bad if e.undefined is not None})  # all of bad (mypy: narrowed)
        shown = ", ".join(str(e.index) for e in bad[:8]) + (", ..." if len(bad) > 8 else "")
        rank_zero_warn(
            f"{owner}: {len(bad)} of {len(examples)} audited {split!r} examples have undefined results "
            f"({', '.join(causes)}; dataset indices {shown}): their values are NaN and left out of "
            "every aggregate, not counted as unflipped or wrong. Check the model's weights for NaN (a "
            "diverged step? try gradient clipping or a lower learning rate) and its inputs."
        )
    nan = sorted(k for k, v in metrics.items() if isinstance(v, float) and math.isnan(v) and k not in warned)
    if nan:
        warned.update(nan)
        shown = ", ".join(nan[:8]) + (f" and {len(nan) - 8} more" if len(nan) > 8 else "")
        rank_zero_warn(
            f"{owner}: {shown} undefined for the whole {split!r} audit (no audited example gives a "
            "defined value: e.g. no decision flipped, constant maps, one-token texts, non-finite "
            "logits); logged as NaN."
        )

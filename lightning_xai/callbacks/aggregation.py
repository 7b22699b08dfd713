"""From per-example values to the logged scalars: mean, std, significant fraction (NaN instances left out)."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np

from lightning_xai.callbacks.results import AuditExample

__all__ = ["aggregate_values", "summarize_values"]


def summarize_values(values: Sequence[float], p_values: Optional[Sequence[float]] = None,
                     alpha: float = 0.05) -> Dict[str, float]:
    """Mean, standard deviation (population, as ``numpy.std``), count and — given p-values — the fraction
    with ``p <= alpha`` of per-example values. NaNs (undefined instances, e.g. τ of a one-token text) are left
    out of the mean/std and counted in ``undefined``.

    Example:
        >>> {k: round(v, 6) for k, v in summarize_values([0.2, 0.4, float("nan")], [0.01, 0.5, float("nan")]).items()}
        {'mean': 0.3, 'std': 0.1, 'count': 2, 'undefined': 1, 'significant_fraction': 0.5}
    """
    arr = np.asarray(list(values), dtype=np.float64)
    ok = ~np.isnan(arr)
    out: Dict[str, float] = {
        "mean": float(arr[ok].mean()) if ok.any() else float("nan"),
        "std": float(arr[ok].std()) if ok.any() else float("nan"),
        "count": int(ok.sum()),
        "undefined": int((~ok).sum()),
    }
    if p_values is not None:
        p = np.asarray(list(p_values), dtype=np.float64)[ok]
        out["significant_fraction"] = float((p <= alpha).mean()) if p.size else float("nan")
    return out


def aggregate_values(examples: List[AuditExample]) -> Dict[str, float]:
    """``<name>/mean``, ``<name>/std`` and (for values with a ``<name>/p_value``) ``<name>/significant_fraction``
    of every per-example value.

    Example:
        >>> e = [AuditExample(p, p, "val", [], None, 0, 1.0, values={"v": v}) for p, v in enumerate([1.0, 3.0])]
        >>> aggregate_values(e)
        {'v/mean': 2.0, 'v/std': 1.0}
    """
    out: Dict[str, float] = {}
    names = sorted({k for e in examples for k in e.values if not k.endswith("/p_value")})
    for name in names:
        values = [e.values.get(name, float("nan")) for e in examples]
        p_name = f"{name}/p_value"
        p_values = [e.values.get(p_name, float("nan")) for e in examples] if any(
            p_name in e.values for e in examples) else None
        for stat, value in summarize_values(values, p_values).items():
            if stat in ("mean", "std", "significant_fraction"):
                out[f"{name}/{stat}"] = value
    return out

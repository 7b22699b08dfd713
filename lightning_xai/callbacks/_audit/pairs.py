"""The strongest token pairs an audit keeps for the report: Integrated Hessians' interaction matrix Γ ``[T, T]`` of an
example is quadratic in its length; a report shows only the ``k`` pairs of tokens i ≠ j with the largest ``|Γ_ij|``
and Γ over the few tokens they involve (:class:`TokenPairs`), so an example keeps at most ``(2k)²`` numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["DEFAULT_TOP_PAIRS", "TokenPairs", "strongest_pairs"]


#: pairs kept per shown example when an audit computes Integrated Hessians
DEFAULT_TOP_PAIRS = 10


@dataclass
class TokenPairs:
    """The ``k`` strongest off-diagonal entries of one example's interaction matrix Γ, and Γ over their tokens.

    Attributes:
        positions: the tokens involved, as positions among the example's real tokens (indices into
            :attr:`AuditExample.token_ids`), ascending.
        gamma: Γ restricted to ``positions`` (``gamma[a][b] = Γ[positions[a], positions[b]]``), diagonal included.
        pairs: ``(i, j, Γ_ij)`` with ``i < j`` (real-token positions), strongest ``|Γ_ij|`` first.
        method: the attribution method Γ comes from.

    Example:
        >>> TokenPairs([0, 2], [[0.5, -0.1], [-0.1, 0.2]], [(0, 2, -0.1)]).pairs
        [(0, 2, -0.1)]
    """

    positions: List[int]
    gamma: List[List[float]]
    pairs: List[Tuple[int, int, float]]
    method: str = field(default="integrated_hessians")


def strongest_pairs(
    gamma: Tensor, k: int = DEFAULT_TOP_PAIRS, method: str = "integrated_hessians"
) -> Optional[TokenPairs]:
    """The ``k`` token pairs ``i < j`` of ``gamma`` (``[n, n]`` over an example's real tokens) with the largest
    ``|Γ_ij|``, skipping zero and non-finite entries; ``None`` when no pair is left (one token, an all-zero Γ).

    Γ is symmetric off the diagonal up to quadrature error; a pair is ranked by, and keeps, its upper entry Γ_ij.

    Example:
        >>> g = torch.tensor([[1.0, 0.25, -0.5], [0.25, 2.0, 0.0], [-0.5, 0.0, 3.0]])
        >>> top = strongest_pairs(g, k=2)
        >>> top.pairs, top.positions
        ([(0, 2, -0.5), (0, 1, 0.25)], [0, 1, 2])
        >>> strongest_pairs(torch.ones(1, 1)) is None
        True
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int; got {k!r}.")
    gamma = gamma.detach().double().cpu()
    n = gamma.shape[0]
    rows, cols = torch.triu_indices(n, n, offset=1)
    values = gamma[rows, cols]
    keep = torch.isfinite(values) & (values != 0)
    rows, cols, values = rows[keep], cols[keep], values[keep]
    if not values.numel():
        return None
    order = values.abs().argsort(descending=True, stable=True)[:k]
    pairs = [(int(rows[o]), int(cols[o]), float(values[o])) for o in order]
    positions = sorted({p for i, j, _ in pairs for p in (i, j)})
    index = torch.tensor(positions)
    return TokenPairs(positions=positions, gamma=gamma[index][:, index].tolist(), pairs=pairs, method=method)

"""The memory budget of batched variant passes: consecutive chunks of work whose buffers fit a number of elements.

A method that scores many variants of a batch (leave-one-out's deletions, decision flip's attention overrides) runs
them in chunks whose largest buffers hold at most :data:`PASS_BUDGET_ELEMENTS` elements: the reference BiLSTM's
deletion reruns (``AttentionClassifier.deletion_logits``) and the last-layer attention of the ``transformers``
override replay (:mod:`lightning_xai.adapters.huggingface.replay`) are sized by :func:`budget_chunks`.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

__all__ = ["PASS_BUDGET_ELEMENTS", "budget_chunks"]

#: default memory budget of a chunk's buffers, in elements (64M float32: 256 MiB)
PASS_BUDGET_ELEMENTS = 1 << 26


def budget_chunks(costs: Tensor, max_elements: Optional[int]) -> List[Tuple[int, int]]:
    """``(start, end)`` ranges cutting ``costs`` (elements of each piece of work, in the order they run) into
    consecutive chunks whose costs sum to at most ``max_elements`` (at least one piece per chunk: a piece larger
    than the budget runs alone); ``None``: one chunk of everything.

    Example:
        >>> budget_chunks(torch.tensor([4, 4, 4, 9, 1]), 8)
        [(0, 2), (2, 3), (3, 4), (4, 5)]
        >>> budget_chunks(torch.tensor([4, 4, 4]), None)
        [(0, 3)]
    """
    n = costs.numel()
    if max_elements is None:
        return [(0, n)] if n else []
    if max_elements < 1:
        raise ValueError(f"max_elements must be a positive number of elements or None, got {max_elements}.")
    total, chunks, start = torch.cumsum(costs.detach().cpu().long(), 0), [], 0
    while start < n:
        spent = int(total[start - 1]) if start else 0
        end = max(start + 1, int(torch.searchsorted(total, spent + max_elements, right=True)))
        chunks.append((start, end))
        start = end
    return chunks

"""C − D and the tied pairs of short rows from the signs of every pair of tokens (the fast path of ``kendall_tau``).

On rows of a few tens of tokens the all-pairs signs — one subtraction, one ``sign_`` and one batched matmul over a
block of rows — are several times faster than Knight's merge passes (benchmarks/bench_kendall.py), while their
``T²`` memory is small. :func:`concordance` gives exactly the integers (C − D, the tied pairs of each map) of
Knight's count in :func:`~lightning_xai.metrics.functional.agreement._rank_stats`, so τ and its p-value do not depend
on the path.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

__all__ = ["concordance", "pair_elements"]

# dtypes whose values float32 holds exactly (float64 maps are checked value by value)
_FLOAT32_EXACT = (torch.float32, torch.float16, torch.bfloat16)


def pair_elements(T: int) -> int:
    """Elements of one row's pairwise signs (``2 × K × W``, ``W = T | 1``, ``K = (W − 1) / 2``): what a row costs
    the block budget.

    Example:
        >>> pair_elements(50)
        2550
    """
    W = T | 1
    return 2 * ((W - 1) // 2) * W


def concordance(x: Tensor, y: Tensor, mask: Tensor) -> Tuple[Tensor, Tensor]:
    """``(cmd [B], ties [B, 2])`` float64 per row over pairs of real tokens: C − D = Σ sign(x_i − x_j)·sign(y_i − y_j)
    and the pairs tied in x and in y.

    Pads are set to 0 and every unordered pair is visited once: with the width made odd (W = T | 1), the cyclic
    shifts k = 1 … (W − 1)/2 pair token i with token (i + k) mod W, and each pair {i, j} occurs for exactly one
    (i, k). One subtraction and one ``sign_`` over ``[B, 2, K, W]`` give both maps' signs; one batched matmul of
    the signs with themselves gives Σ sx·sy (= C − D), Σ sx² and Σ sy² (the pairs not tied) per row. A pair of a
    real token i with a pad (value 0) adds sign(x_i)·sign(y_i) and |sign(x_i)|, which is subtracted in O(T). All
    sums are of −1/0/+1 values: exact integers in float32 below 2^24 pairs.

    Example:
        >>> cmd, ties = concordance(torch.tensor([[1., 2., 2., 9.]]), torch.tensor([[3., 1., 2., 0.]]),
        ...                         torch.tensor([[True, True, True, False]]))
        >>> cmd.tolist(), ties.tolist()
        ([-2.0], [[1.0, 0.0]])
    """
    B, T = x.shape
    W = T | 1  # odd: shifts 1 … K cover every unordered pair exactly once
    K = (W - 1) // 2
    both = torch.stack((x, y), 1).double().masked_fill(~mask.unsqueeze(1), 0.0)
    # float32 keeps signs and sums exact if it holds every value (and the pair count stays below 2^24)
    exact32 = W * K < (1 << 24) and (
        x.dtype in _FLOAT32_EXACT and y.dtype in _FLOAT32_EXACT or torch.equal(both.float().double(), both)
    )
    dtype = torch.float32 if exact32 else torch.float64
    doubled = both.new_zeros((B, 2, 2 * W), dtype=dtype)
    doubled[:, :, :T] = both
    doubled[:, :, W : W + T] = both
    values = doubled[:, :, :W]
    # shifted[.., k-1, i] = value i+k: a strided view of the doubled row
    shifted = doubled.as_strided(
        (B, 2, K, W), (doubled.stride(0), doubled.stride(1), 1, 1), doubled.storage_offset() + 1
    )
    signs = torch.empty((B, 2, K * W), dtype=dtype, device=x.device)  # sign(value_i − value_{i+k})
    torch.sub(values.unsqueeze(2), shifted, out=signs.view(B, 2, K, W)).sign_()
    own = values.sign()  # [B, 2, W], 0 at pads
    n = mask.sum(1).double()
    pads = W - n
    # pairs (real i, pad j): their Σ sx·sy and Σ sx² are the Gram of the tokens' own signs, once per pad
    gram = (
        torch.bmm(signs, signs.transpose(1, 2)).double()
        - pads.view(B, 1, 1) * torch.bmm(own, own.transpose(1, 2)).double()
    )
    ties = (n * (n - 1) / 2).unsqueeze(1) - torch.diagonal(gram, dim1=1, dim2=2)
    return gram[:, 0, 1], ties

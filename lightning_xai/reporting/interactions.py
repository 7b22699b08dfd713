"""The strongest token pairs of an example (Integrated Hessians' Γ) as a small signed heatmap table."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from lightning_xai.reporting.html import _esc, _text_colour, score_colour

__all__ = ["PAIRS_CAPTION", "pair_heatmap_html"]

#: what a cell of the pair heatmap is
PAIRS_CAPTION = (
    "Γ_ij (Integrated Hessians, Janizek et al. 2021): the interaction of tokens i and j, the part of "
    "token i's Integrated Gradients attribution due to token j (Σ_j Γ_ij = IG_i; diagonal not shown), "
    "over the tokens of the {k} strongest pairs by |Γ_ij| (bold); blue positive, red negative."
)


def pair_heatmap_html(
    tokens: Sequence[str], interactions: Any, title: Optional[str] = None, anchor: Optional[str] = None
) -> str:
    """An ``[n × n]`` table of Γ over the tokens of an example's strongest pairs, then the pairs as a list.

    Args:
        tokens: the example's words, one per real token (escaped here).
        interactions: a :class:`~lightning_xai.callbacks.TokenPairs` (``positions``, ``gamma``,
            ``pairs``).
        title: optional heading (escaped).
        anchor: optional element id of the block.

    Every cell carries ``data-gamma`` (Γ of its row and column tokens) and every listed pair ``data-i``,
    ``data-j`` (real-token positions) and ``data-gamma``.

    Example:
        >>> from lightning_xai.callbacks import TokenPairs
        >>> out = pair_heatmap_html(["not", "<b>", "good"], TokenPairs([0, 2], [[0.1, -0.4], [-0.4, 0.3]],
        ...                                                             [(0, 2, -0.4)]))
        >>> 'data-gamma="-0.4"' in out, "not × good" in out, "<b>" in out
        (True, True, False)
    """
    positions = list(interactions.positions)
    labels = [_label(tokens, p) for p in positions]
    gamma = [[float(v) for v in row] for row in interactions.gamma]
    strong = {(i, j) for i, j, _ in interactions.pairs} | {(j, i) for i, j, _ in interactions.pairs}
    off = [
        abs(gamma[a][b])
        for a in range(len(positions))
        for b in range(len(positions))
        if a != b and math.isfinite(gamma[a][b])
    ]
    scale = max(off) if off else 0.0
    ident = f' id="{_esc(anchor)}"' if anchor else ""
    parts = [f'<div class="pairs" style="margin:12px 0 20px 0"{ident}>']
    if title:
        parts.append(f"<h4>{_esc(title)}</h4>")
    parts.append(f'<div class="meta">{_esc(PAIRS_CAPTION.format(k=len(interactions.pairs)))}</div>')
    head = "".join(f'<th title="token {p}">{_esc(w)}</th>' for p, w in zip(positions, labels))
    rows = []
    for a, (p, word) in enumerate(zip(positions, labels)):
        cells = []
        for b, q in enumerate(positions):
            if a == b:
                cells.append('<td class="num" style="background:#f3f3f3">—</td>')
                continue
            value = gamma[a][b]
            weight = "font-weight:700;" if (p, q) in strong else ""
            cells.append(
                f'<td class="num" data-gamma="{value:.6g}" title="{_esc(word)} × {_esc(labels[b])}: '
                f'Γ = {value:.4g}" style="white-space:nowrap;{weight}background:{score_colour(value, scale)};'
                f'color:{_text_colour(value, scale)}">{value:.3g}</td>'
            )
        rows.append(f'<tr><th title="token {p}">{_esc(word)}</th>{"".join(cells)}</tr>')
    parts.append(f'<div class="wide"><table><tr><th>Γ_ij</th>{head}</tr>{"".join(rows)}</table></div>')
    items = "".join(
        f'<li data-i="{i}" data-j="{j}" data-gamma="{value:.6g}">{_esc(_label(tokens, i))} × '
        f"{_esc(_label(tokens, j))}: {value:+.4g}</li>"
        for i, j, value in interactions.pairs
    )
    parts.append(
        f"<details><summary>The {len(interactions.pairs)} strongest pairs</summary><ol>{items}</ol></details></div>"
    )
    return "".join(parts)


def _label(tokens: Sequence[str], position: int) -> str:
    return str(tokens[position]) if 0 <= position < len(tokens) else str(position)

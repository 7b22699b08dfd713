"""A generator example's per-step maps as source tokens × target tokens heatmaps (HTML tables), and as the long
rows of a W&B table.

An audited generator example (``AttentionAudit`` on a causal LM or an encoder–decoder) the report shows keeps, per
map — attention and each method — one row per explained target step over its source tokens
(``AuditExample.step_maps[name][k][i]``): attention's row of step ``k``, or the method's map of ``log p(y_k | y_<k,
source)``. Each map becomes one table: a row per target token, a column per source token. Each row is scaled to
its own largest |score| (as every token heatmap's row is): it shows which source tokens that step uses.
"""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from lightning_xai.reporting.html import _esc, _text_colour, score_colour
from lightning_xai.reporting.word_pieces import merge_word_pieces

__all__ = ["MAX_STEP_EXAMPLES", "STEPS_CAPTION", "step_examples", "step_heatmap_html", "step_table_rows", "step_words"]

#: how many generator examples a report (and a W&B step) shows as source × target heatmaps by default
MAX_STEP_EXAMPLES = 3
#: what a cell of a step heatmap is
STEPS_CAPTION = (
    "One row per target token (the step that predicts it), one column per source token: attention's "
    "row of that step, or the method's map of the step's log-probability log p(y_k | y_<k, source). "
    "Each row is scaled to its own largest |score|; blue positive, red negative."
)


def step_words(example: Any) -> Tuple[List[str], List[str]]:
    """The source and target words of a generator example (its ``tokens`` and ``target_tokens``, else the ids).

    Example:
        >>> from types import SimpleNamespace
        >>> step_words(SimpleNamespace(tokens=["a", "b"], token_ids=[4, 5], target_tokens=None,
        ...                            target_token_ids=[7]))
        (['a', 'b'], ['7'])
    """
    source = example.tokens or [str(i) for i in example.token_ids]
    target = example.target_tokens or [str(i) for i in example.target_token_ids or []]
    return [str(w) for w in source], [str(w) for w in target]


def _checked(
    source: Sequence[str], target: Sequence[str], name: str, rows: Sequence[Sequence[float]]
) -> List[List[float]]:
    if len(rows) != len(target) or any(len(row) != len(source) for row in rows):
        raise ValueError(
            f"step map {name!r} is {len(rows)} × {sorted({len(r) for r in rows})} for {len(target)} "
            f"target × {len(source)} source tokens."
        )
    return [[float(v) for v in row] for row in rows]


def step_heatmap_html(
    source: Sequence[str],
    target: Sequence[str],
    step_maps: Mapping[str, Sequence[Sequence[float]]],
    title: Optional[str] = None,
    anchor: Optional[str] = None,
    merge_pieces: bool = False,
) -> str:
    """One table per map of an example's ``step_maps`` (``{name: [target][source]}``): target tokens down, source
    tokens across, every cell shaded by its score (its row's scale) and carrying ``data-score``.

    Args:
        source: the source words (escaped here).
        target: the target words, one per step (escaped here).
        step_maps: map name -> one row of scores over ``source`` per target step.
        title: optional heading (escaped).
        anchor: optional element id of the block.
        merge_pieces: show the source's word pieces as words (:func:`~lightning_xai.reporting.merge_word_pieces`:
            each word's score in a row is the sum of its pieces'); the target's pieces stay as they are.

    Example:
        >>> out = step_heatmap_html(["ἀρχῇ", "<i>"], ["In", "beginning"],
        ...                         {"attention": [[0.75, 0.25], [0.5, 0.5]]}, title="Example 3")
        >>> 'data-score="0.75"' in out, ">beginning</th>" in out, "<i>" in out, ">&lt;i&gt;</th>" in out
        (True, True, False, True)
    """
    ident = f' id="{_esc(anchor)}"' if anchor else ""
    parts = [f'<div class="steps" style="margin:12px 0 20px 0"{ident}>']
    if title:
        parts.append(f"<h4>{_esc(title)}</h4>")
    parts.append(f'<div class="meta">{_esc(STEPS_CAPTION)}</div>')
    for name, given in step_maps.items():
        rows = _checked(source, target, name, given)
        words = [str(w) for w in source]
        if merge_pieces and rows:
            words, merged = merge_word_pieces(words, {str(k): row for k, row in enumerate(rows)})
            rows = [merged[str(k)] for k in range(len(rows))]
        head = "".join(
            f'<th style="writing-mode:vertical-rl" title="source token {i}">{_esc(w)}</th>' for i, w in enumerate(words)
        )
        body = []
        for k, (word, row) in enumerate(zip(target, rows)):
            finite = [abs(v) for v in row if math.isfinite(v)]
            scale = max(finite) if finite else 0.0
            cells = "".join(
                f'<td class="num" data-score="{v:.6g}" title="{_esc(word)} ← {_esc(src)}: {_esc(name)} = {v:.4g}" '
                f'style="white-space:nowrap;background:{score_colour(v, scale)};color:{_text_colour(v, scale)}">'
                f"{v:.2g}</td>"
                for src, v in zip(words, row)
            )
            body.append(f'<tr><th title="target step {k}">{_esc(word)}</th>{cells}</tr>')
        parts.append(
            f'<div class="wide" data-map="{_esc(name)}"><table><caption style="text-align:left">'
            f"<b>{_esc(name)}</b></caption><tr><th>target ↓ source →</th>{head}</tr>{''.join(body)}"
            "</table></div>"
        )
    parts.append("</div>")
    return "".join(parts)


def step_table_rows(example: Any) -> List[List[Any]]:
    """The cells of a generator example's step maps as rows ``[index, map, step, target token, source position,
    source token, score]`` (one per source × target cell, numbers kept as numbers) for a W&B table.

    Example:
        >>> from types import SimpleNamespace
        >>> ex = SimpleNamespace(index=3, tokens=["a", "b"], token_ids=[4, 5], target_tokens=["x"],
        ...                      target_token_ids=[7], step_maps={"attention": [[0.25, 0.75]]})
        >>> step_table_rows(ex)
        [[3, 'attention', 0, 'x', 0, 'a', 0.25], [3, 'attention', 0, 'x', 1, 'b', 0.75]]
    """
    source, target = step_words(example)
    out: List[List[Any]] = []
    for name, given in example.step_maps.items():
        rows = _checked(source, target, name, given)
        out.extend(
            [example.index, name, k, target[k], i, source[i], value]
            for k, row in enumerate(rows)
            for i, value in enumerate(row)
        )
    return out


def step_examples(examples: Sequence[Any], limit: int = MAX_STEP_EXAMPLES) -> List[Any]:
    """The first ``limit`` examples that keep step maps (a generator's shown examples).

    Example:
        >>> from types import SimpleNamespace
        >>> [e.index for e in step_examples([SimpleNamespace(index=1, step_maps={}),
        ...                                  SimpleNamespace(index=2, step_maps={"attention": [[1.0]]})])]
        [2]
    """
    return [e for e in examples if getattr(e, "step_maps", None)][:limit]

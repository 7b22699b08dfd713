"""Self-contained HTML: token heatmaps (one row per map, aligned token by token) and the audit report page.

No external resource is referenced (no CDN, no script): styles are inline, images are ``data:`` URIs, and a
Content-Security-Policy forbids scripts altogether. Every piece of text (tokens, names, titles) is HTML-escaped, so
an input containing ``<script>`` is shown as text and never runs.
"""

from __future__ import annotations

import base64
import html
import math
import os
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

__all__ = [
    "COLOUR_POSITIVE",
    "COLOUR_NEGATIVE",
    "score_colour",
    "legend_html",
    "token_heatmap_html",
    "history_table_html",
    "latest_table_html",
    "render_report",
    "png_data_uri",
    "ReportSection",
]

COLOUR_POSITIVE = (33, 102, 172)  # blue: the score pushes towards the explained class
COLOUR_NEGATIVE = (178, 24, 43)  # red: the score pushes away from it

_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px;color:#1b1b1b;max-width:1400px;
overflow-wrap:anywhere}
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}h3{font-size:1.05em}
table{border-collapse:collapse;margin:8px 0;max-width:100%}
td,th{padding:3px 8px;border:1px solid #ddd;font-size:.9em;text-align:left}
th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}
.wide{overflow-x:auto;max-width:100%}
.heatmap{margin:12px 0 20px 0}.heatmap table{width:100%;table-layout:fixed}
.heatmap td.map{font-weight:600;width:12em;background:#fafafa;vertical-align:top}
.heatmap td.doc{line-height:1.9}.heatmap tr.long td.doc div{max-height:15em;overflow-y:auto}
.tok{display:inline-block;padding:1px 3px;margin:1px;border-radius:3px;font-family:ui-monospace,monospace;
font-size:.9em;max-width:100%;overflow-wrap:anywhere}
.legend{display:flex;flex-wrap:wrap;align-items:center;gap:8px;margin:8px 0}
.scale{width:260px;height:14px;border:1px solid #999;border-radius:2px}
.meta{color:#555;font-size:.9em}img{max-width:100%;height:auto;border:1px solid #eee}figure{margin:12px 0}
.headline{background:#f6f8fb;border:1px solid #d5dde8;border-radius:6px;padding:4px 16px 8px 16px}
.headline h2{margin-top:.6em}.headline .claim p{margin:.3em 0}
"""

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def score_colour(score: float, scale: float) -> str:
    """CSS background for ``score`` on a diverging scale: white at 0, blue for positive, red for negative,
    full opacity at ``|score| = scale``.

    Example:
        >>> score_colour(0.5, 1.0), score_colour(-1.0, 1.0), score_colour(0.0, 0.0)
        ('rgba(33,102,172,0.500)', 'rgba(178,24,43,1.000)', 'rgba(33,102,172,0.000)')
    """
    if not math.isfinite(score):
        return "rgba(128,128,128,0.3)"
    alpha = 0.0 if scale <= 0 else min(1.0, abs(score) / scale)
    r, g, b = COLOUR_POSITIVE if score >= 0 else COLOUR_NEGATIVE
    return f"rgba({r},{g},{b},{alpha:.3f})"


def _text_colour(score: float, scale: float) -> str:
    return "#fff" if scale > 0 and math.isfinite(score) and abs(score) / scale > 0.6 else "#111"


def legend_html() -> str:
    """The colour scale legend shared by every heatmap."""
    neg = "rgba({},{},{},1)".format(*COLOUR_NEGATIVE)
    pos = "rgba({},{},{},1)".format(*COLOUR_POSITIVE)
    return (
        f'<div class="legend" id="legend"><span>−max |score|</span>'
        f'<div class="scale" style="background:linear-gradient(to right,{neg},#ffffff,{pos})"></div>'
        '<span>+max |score|</span><span class="meta">Each row (one map of one example) is scaled to its own '
        "largest |score|: darker = more important; blue = positive, red = negative score.</span></div>"
    )


def token_heatmap_html(
    tokens: Sequence[str],
    maps: Mapping[str, Sequence[float]],
    title: Optional[str] = None,
    caption: Optional[str] = None,
    long_document: int = 120,
) -> str:
    """One example as a table: a row per map (attention, gradient, IG, LOO, ...), the tokens of the row wrapping
    across the page width.

    Args:
        tokens: the words (escaped here).
        maps: map name -> one score per token.
        title: optional heading (escaped).
        caption: optional line under the heading (escaped).
        long_document: above this many tokens (e.g. an ERASER movie review) each row scrolls inside a box of
            about fifteen lines instead of filling pages.

    Example:
        >>> out = token_heatmap_html(["<script>x</script>", "good"], {"attention": [0.2, 0.8]})
        >>> "<script>" in out, "&lt;script&gt;" in out
        (False, True)
    """
    tokens = [str(t) for t in tokens]
    parts = ['<div class="heatmap">']
    if title:
        parts.append(f"<h3>{_esc(title)}</h3>")
    if caption:
        parts.append(f'<div class="meta">{_esc(caption)}</div>')
    parts.append("<table>")
    row_class = ' class="long"' if len(tokens) > long_document else ""
    for name, scores in maps.items():
        scores = [float(s) for s in scores]
        if len(scores) != len(tokens):
            raise ValueError(f"map {name!r} has {len(scores)} scores for {len(tokens)} tokens.")
        finite = [abs(s) for s in scores if math.isfinite(s)]
        scale = max(finite) if finite else 0.0
        cells = " ".join(
            f'<span class="tok" title="{_esc(name)}: {s:.4g}" data-score="{s:.6g}" '
            f'style="background:{score_colour(s, scale)};color:{_text_colour(s, scale)}">{_esc(tok)}</span>'
            for tok, s in zip(tokens, scores)
        )
        parts.append(f'<tr{row_class}><td class="map">{_esc(name)}</td><td class="doc"><div>{cells}</div></td></tr>')
    parts.append("</table></div>")
    return "".join(parts)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.4f}"
    return _esc(value)


def history_table_html(history: Sequence[Mapping[str, Any]], keys: Optional[Sequence[str]] = None) -> str:
    """A table of audit records: one row per audit (stage, epoch, step), one column per metric.

    Example:
        >>> rows = [{"stage": "fit", "epoch": 0, "global_step": 10, "metrics": {"tau": 0.5}}]
        >>> "0.5000" in history_table_html(rows)
        True
    """
    if not history:
        return '<p class="meta">No audit has run yet.</p>'
    if keys is None:
        keys = []
        for record in history:
            keys.extend(k for k in record["metrics"] if k not in keys)
    head = "".join(f"<th>{_esc(k)}</th>" for k in ["stage", "epoch", "step", *keys])
    rows = []
    for r in history:
        cells = [_esc(r.get("stage")), _esc(r.get("epoch")), _esc(r.get("global_step"))]
        cells += [_fmt(r["metrics"].get(k, float("nan"))) for k in keys]
        rows.append("<tr>" + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>")
    return f'<div class="wide"><table><tr>{head}</tr>{"".join(rows)}</table></div>'


_STATS = ("mean", "std", "significant_fraction")


def _split_stat(key: str) -> Tuple[str, str]:
    head, _, tail = key.rpartition("/")
    return (head, tail) if head and tail in _STATS else (key, "value")


def latest_table_html(metrics: Mapping[str, float]) -> str:
    """The metrics of one audit as a table: a row per result, a column per statistic (mean, std, ...).

    Example:
        >>> out = latest_table_html({"tau/mean": 0.5, "tau/std": 0.1})
        >>> "<td>tau</td>" in out and "0.5000" in out and "0.1000" in out
        True
    """
    rows: Dict[str, Dict[str, float]] = {}
    for key, value in metrics.items():
        name, stat = _split_stat(key)
        rows.setdefault(name, {})[stat] = value
    columns = [c for c in (*_STATS, "value") if any(c in r for r in rows.values())]
    head = "".join(f"<th>{_esc(c.replace('_', ' '))}</th>" for c in ["result", *columns])
    body = "".join(
        "<tr><td>"
        + _esc(name)
        + "</td>"
        + "".join(f'<td class="num">{_fmt(r[c]) if c in r else ""}</td>' for c in columns)
        + "</tr>"
        for name, r in rows.items()
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def png_data_uri(path: str) -> str:
    """A PNG file as a ``data:`` URI, so the report embeds it and needs no other file."""
    with open(path, "rb") as handle:
        return "data:image/png;base64," + base64.b64encode(handle.read()).decode("ascii")


class ReportSection:
    """One part of the report: a heading, trusted HTML built by this module, and optional PNG files.

    ``images`` are ``(caption, path)`` or ``(caption, path, element id)``; ``anchor`` is the section's id.
    """

    def __init__(
        self, title: str, body_html: str = "", images: Iterable[Sequence[str]] = (), anchor: Optional[str] = None
    ) -> None:
        self.title = title
        self.body_html = body_html
        self.images = [tuple(image) for image in images]
        self.anchor = anchor

    def render(self) -> str:
        anchor = f' id="{_esc(self.anchor)}"' if self.anchor else ""
        parts = [f"<section{anchor}>", f"<h2>{_esc(self.title)}</h2>" if self.title else "", self.body_html]
        for caption, path, *element in self.images:
            if os.path.exists(path):
                ident = f' id="{_esc(element[0])}"' if element else ""
                parts.append(
                    f'<figure{ident}><img alt="{_esc(caption)}" src="{png_data_uri(path)}">'
                    f'<figcaption class="meta">{_esc(caption)}</figcaption></figure>'
                )
        parts.append("</section>")
        return "".join(parts)


def render_report(
    title: str, sections: Sequence[ReportSection], subtitle: Optional[str] = None, lead: Sequence[ReportSection] = ()
) -> str:
    """The whole report page as one self-contained HTML string: heading, the ``lead`` sections (headline,
    curves), the colour legend, then ``sections``.

    Example:
        >>> page = render_report("run <1>", [ReportSection("A", token_heatmap_html(["a"], {"attention": [1.0]}))])
        >>> page.startswith("<!DOCTYPE html>"), "run &lt;1&gt;" in page, "http" in page.split("<body>")[1]
        (True, True, False)
    """
    head = "".join(s.render() for s in lead)
    body = "".join(s.render() for s in sections)
    sub = f'<p class="meta">{_esc(subtitle)}</p>' if subtitle else ""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1>{sub}{head}{legend_html()}{body}</body></html>"
    )

"""The headline of the report: what the latest audit says, in plain words with its numbers.

Read from the audits' histories by their logged keys (reporting imports no callback): an agreement audit logs
``<metric>/attention_vs_<method>/mean`` (and ``/std``, ``/significant_fraction``), an erasure audit logs
``<ranking>/comprehensiveness/mean`` and ``<ranking>/flipped/mean``. What no audit measured is said to be absent.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from lightning_xai.metrics.registry import metric_label
from lightning_xai.reporting.html import _esc

__all__ = ["headline_sentences", "headline_html"]

_PAIR = re.compile(r"^(?P<metric>[^/]+)/(?P<first>.+)_vs_(?P<second>[^/]+)/mean$")
_ERASURE = ("comprehensiveness", "flipped")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _where(record: Mapping[str, Any]) -> str:
    return f"{record.get('stage')}, epoch {record.get('epoch')}, {record.get('num_examples', '?')} examples"


def _strength(tau: float) -> str:
    size = abs(tau)
    word = "no" if size < 0.1 else "weak" if size < 0.3 else "moderate" if size < 0.5 else "strong"
    return word + (" (negative)" if tau < 0 and size >= 0.1 else "")


def _trend(history: Sequence[Mapping[str, Any]], key: str, label: str) -> Optional[str]:
    """First → last value of ``key`` over the training audits (``fit`` records: one split, comparable)."""
    records = [r for r in history if r.get("stage") == "fit" and _finite(r["metrics"].get(key))]
    if len(records) < 2:
        return None
    first, last = records[0], records[-1]
    a, b = first["metrics"][key], last["metrics"][key]
    return (f"{label}: {a:.3f} at the first audit (fit, epoch {first.get('epoch')}) → {b:.3f} at epoch "
            f"{last.get('epoch')} ({b - a:+.3f}).")


def _agreement(audit: Any) -> Optional[List[str]]:
    history = audit.history
    metrics = history[-1]["metrics"]
    found: Dict[str, List[Tuple[str, str]]] = {}
    for key in metrics:
        match = _PAIR.match(key)
        if match and _finite(metrics[key]):
            found.setdefault(match["metric"], []).append((match["first"], match["second"]))
    if not found:
        return None
    preferred = [m for m in getattr(audit, "metrics", ()) or () if m in found]
    metric = (preferred or (["kendall_tau"] if "kendall_tau" in found else list(found)))[0]
    name = metric_label(metric)
    pairs = found[metric]
    with_attention = [second for first, second in pairs if first == "attention"]
    others = [(first, second) for first, second in pairs if first != "attention"]
    parts = []
    for method in with_attention:
        key = f"{metric}/attention_vs_{method}"
        text = f"{method} {metrics[key + '/mean']:.3f}"
        if _finite(metrics.get(key + "/std")):
            text += f" ± {metrics[key + '/std']:.3f}"
        if _finite(metrics.get(key + "/significant_fraction")):
            text += f" ({metrics[key + '/significant_fraction']:.0%} of examples significant at p ≤ 0.05)"
        parts.append(text)
    lines = []
    if with_attention:
        strongest = max((metrics[f"{metric}/attention_vs_{m}/mean"] for m in with_attention), key=abs)
        agree = (f"{_strength(strongest)} agreement (largest |{name.split()[-1]}| {abs(strongest):.3f})"
                 if metric.endswith(("tau", "spearman", "pearson")) else "")
        lines.append(f"Attention ↔ faithful maps, {name} at the latest audit ({_where(history[-1])})"
                     + (f" — {agree}" if agree else "") + ": " + "; ".join(parts) + ".")
    else:
        lines.append(f"No pair with attention was audited ({name} pairs: "
                     + ", ".join(f"{a} ↔ {b}" for a, b in pairs) + ").")
    if others:
        best = max(others, key=lambda p: metrics[f"{metric}/{p[0]}_vs_{p[1]}/mean"])
        lines.append(f"For reference, the saliency maps agree with each other up to {name} "
                     f"{metrics[f'{metric}/{best[0]}_vs_{best[1]}/mean']:.3f} ({best[0]} ↔ {best[1]}).")
    trends = [_trend(history, f"{metric}/attention_vs_{m}/mean", f"{name} attention ↔ {m}") for m in with_attention]
    trends = [t for t in trends if t]
    lines.extend(["Trend since the first audit — " + " ".join(trends)] if trends
                 else ["Only one audit so far: no trend yet."])
    return lines


def _erasure(audit: Any) -> Optional[List[str]]:
    history = audit.history
    metrics = history[-1]["metrics"]
    rankings: Dict[str, List[str]] = {}
    for key in metrics:
        head, _, tail = key.rpartition("/")
        ranking, _, measure = head.rpartition("/")
        if tail == "mean" and measure in _ERASURE and ranking and _finite(metrics[key]):
            rankings.setdefault(measure, []).append(ranking)
    if not rankings:
        return None
    lines = []
    for measure in _ERASURE:
        names = rankings.get(measure, [])
        if not names:
            continue
        value = {r: metrics[f"{r}/{measure}/mean"] for r in names}
        what = ("comprehensiveness (drop of the predicted class's probability when the top-ranked tokens are "
                "erased; higher = more faithful)" if measure == "comprehensiveness"
                else "decision flips (fraction of examples whose decision flips as top-ranked attention is zeroed)")
        saliency = [r for r in names if r not in ("attention", "random")]
        best = max(saliency, key=lambda r: value[r]) if saliency else None
        parts = []
        if "attention" in value:
            parts.append(f"attention {value['attention']:.3f}")
        if "random" in value:
            parts.append(f"random {value['random']:.3f}")
        if best is not None:
            parts.append(f"best saliency ranking ({best}) {value[best]:.3f}")
        line = f"Erasure, {what}: " + ", ".join(parts) + "."
        if "attention" in value and "random" in value:
            verdict = "beats" if value["attention"] > value["random"] else "does not beat"
            line += f" Attention {verdict} random ({value['attention'] - value['random']:+.3f})"
            if best is not None:
                gap = value["attention"] - value[best]
                line += f" and is {'ahead of' if gap >= 0 else 'behind'} {best} ({gap:+.3f})"
            line += "."
        missing = [n for n, ok in (("attention", "attention" in value), ("random", "random" in value),
                                   ("a saliency", best is not None)) if not ok]
        if missing:
            line += " Not audited: " + ", ".join(f"{m} ranking" for m in missing) + "."
        lines.append(line)
        if "attention" in value:
            trend = _trend(history, f"attention/{measure}/mean", f"attention {measure}")
            if trend:
                lines.append("Trend since the first audit — " + trend)
    lines.insert(0, f"Latest erasure audit: {_where(history[-1])}.")
    return lines


def headline_sentences(audits: Sequence[Any], training: Sequence[Mapping[str, Any]] = ()) -> Dict[str, List[str]]:
    """The headline as plain sentences, by topic (``agreement``, ``erasure``, ``training``).

    Args:
        audits: audit callbacks (anything with a ``history`` of records).
        training: records of the training's own logged metrics (``epoch``, ``metrics``), oldest first.

    Example:
        >>> class Audit:
        ...     history = [{"stage": "fit", "epoch": 0, "num_examples": 8, "metrics": {
        ...         "kendall_tau/attention_vs_gradient/mean": 0.31, "attention/comprehensiveness/mean": 0.2,
        ...         "random/comprehensiveness/mean": 0.05}}]
        >>> words = headline_sentences([Audit()])
        >>> words["agreement"][0].split(":")[1].strip()
        'gradient 0.310.'
        >>> "Attention beats random (+0.150)" in words["erasure"][1]
        True
    """
    out: Dict[str, List[str]] = {"agreement": [], "erasure": [], "training": []}
    for audit in audits:
        if not getattr(audit, "history", None):
            continue
        for topic, read in (("agreement", _agreement), ("erasure", _erasure)):
            lines = read(audit)
            if lines and not out[topic]:
                out[topic] = lines
    if not out["agreement"]:
        out["agreement"] = ["Absent: no audit compared attention with saliency maps (add AttentionAudit)."]
    if not out["erasure"]:
        out["erasure"] = ["Absent: no erasure audit ran (add ErasureAudit with rankings attention, random and a "
                          "saliency method)."]
    if training:
        last = training[-1]
        shown = [(k, v) for k, v in last["metrics"].items() if k.startswith(("val/", "valid/", "train/"))
                 and ("acc" in k or "loss" in k or "f1" in k or "auroc" in k) and _finite(v)]
        if shown:
            out["training"] = [f"Training, epoch {last['epoch']}: "
                               + ", ".join(f"{k} {v:.4g}" for k, v in sorted(shown)) + "."]
    if not out["training"]:
        out["training"] = ["Absent: no training metric was logged (train/…, val/…)."]
    return out


def headline_html(audits: Sequence[Any], training: Sequence[Mapping[str, Any]] = ()) -> str:
    """The headline block (``<section id="headline">``) of :func:`headline_sentences`, escaped."""
    words = headline_sentences(audits, training)
    titles = {"agreement": "Does attention agree with faithful maps?",
              "erasure": "Does erasing what attention ranks first matter more than random?",
              "training": "Training"}
    parts = ['<section id="headline" class="headline"><h2>Headline</h2>']
    for topic, lines in words.items():
        parts.append(f'<div class="claim" data-topic="{topic}"><h3>{_esc(titles[topic])}</h3>'
                     + "".join(f"<p>{_esc(line)}</p>" for line in lines) + "</div>")
    parts.append("</section>")
    return "".join(parts)

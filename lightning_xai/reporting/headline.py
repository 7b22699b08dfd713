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
from lightning_xai.reporting.curves import split_stage
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
    return "no" if size < 0.1 else "weak" if size < 0.3 else "moderate" if size < 0.5 else "strong"


def _verdict(values: Mapping[str, float], symbol: str) -> str:
    """Agreement of attention with each method in words; the sign picks the word, never the size alone.

    A positive correlation is agreement; a negative one ranks the tokens the other way round, which is never
    called agreement (with a signed map it usually means the map's sign, not its size, decides the ranking).

    Example:
        >>> _verdict({"gradient": 0.574, "grad_x_input": -0.244}, "τ")
        'strong agreement (largest τ 0.574, gradient); weak negative correlation with grad_x_input (τ -0.244: opposite rankings)'
        >>> _verdict({"grad_x_input": -0.574}, "τ")
        'no agreement; strong negative correlation with grad_x_input (τ -0.574: opposite rankings)'
    """
    best = max(values, key=lambda m: values[m])
    worst = min(values, key=lambda m: values[m])
    if values[best] >= 0.1:
        words = f"{_strength(values[best])} agreement (largest {symbol} {values[best]:.3f}, {best})"
    else:
        words = "no agreement" + (f" (largest {symbol} {values[best]:.3f})" if values[worst] > -0.1 else "")
    if values[worst] <= -0.1:
        words += (
            f"; {_strength(values[worst])} negative correlation with {worst} ({symbol} {values[worst]:.3f}: "
            "opposite rankings)"
        )
    return words


def _trend(history: Sequence[Mapping[str, Any]], key: str, label: str) -> Optional[str]:
    """First → last value of ``key`` over the training audits (``fit`` records: one split, comparable)."""
    records = [r for r in history if r.get("stage") == "fit" and _finite(r["metrics"].get(key))]
    if len(records) < 2:
        return None
    first, last = records[0], records[-1]
    a, b = first["metrics"][key], last["metrics"][key]
    return (
        f"{label}: {a:.3f} at the first audit (fit, epoch {first.get('epoch')}) → {b:.3f} at epoch "
        f"{last.get('epoch')} ({b - a:+.3f})."
    )


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
        agree = (
            _verdict({m: metrics[f"{metric}/attention_vs_{m}/mean"] for m in with_attention}, name.split()[-1])
            if metric.endswith(("tau", "spearman", "pearson"))
            else ""
        )
        lines.append(
            f"Attention ↔ faithful maps, {name} at the latest audit ({_where(history[-1])})"
            + (f" — {agree}" if agree else "")
            + ": "
            + "; ".join(parts)
            + "."
        )
    else:
        lines.append(
            f"No pair with attention was audited ({name} pairs: " + ", ".join(f"{a} ↔ {b}" for a, b in pairs) + ")."
        )
    if others:
        best = max(others, key=lambda p: metrics[f"{metric}/{p[0]}_vs_{p[1]}/mean"])
        lines.append(
            f"For reference, the saliency maps agree with each other up to {name} "
            f"{metrics[f'{metric}/{best[0]}_vs_{best[1]}/mean']:.3f} ({best[0]} ↔ {best[1]})."
        )
    trends = [
        t
        for t in (_trend(history, f"{metric}/attention_vs_{m}/mean", f"{name} attention ↔ {m}") for m in with_attention)
        if t
    ]
    lines.extend(
        ["Trend since the first audit — " + " ".join(trends)] if trends else ["Only one audit so far: no trend yet."]
    )
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
        what = (
            "comprehensiveness (drop of the predicted class's probability when the top-ranked tokens are "
            "erased; higher = more faithful)"
            if measure == "comprehensiveness"
            else "decision flips (fraction of examples whose decision flips as top-ranked attention is zeroed)"
        )
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
        missing = [
            n
            for n, ok in (
                ("attention", "attention" in value),
                ("random", "random" in value),
                ("a saliency", best is not None),
            )
            if not ok
        ]
        if missing:
            line += " Not audited: " + ", ".join(f"{m} ranking" for m in missing) + "."
        lines.append(line)
        if "attention" in value:
            trend = _trend(history, f"attention/{measure}/mean", f"attention {measure}")
            if trend:
                lines.append("Trend since the first audit — " + trend)
    lines.insert(0, f"Latest erasure audit: {_where(history[-1])}.")
    return lines


def _epochs(numbers: Sequence[int]) -> str:
    return ", ".join(str(n) for n in numbers[:12]) + (f" … ({len(numbers)} in all)" if len(numbers) > 12 else "")


def _schedule(audit: Any, last_epoch: Optional[int]) -> Optional[str]:
    """What the cost budget changed (an audit's ``plan``: ``cadence``, ``num_samples``, ``share``, ``fits``) and
    which training epochs it left unaudited, read from the audit's ``fit`` records; ``None`` when it changed
    nothing."""
    plan = getattr(audit, "plan", None)
    fit = [r for r in audit.history if r.get("stage") == "fit" and isinstance(r.get("epoch"), int)]
    cadence, samples = getattr(plan, "cadence", 1), getattr(plan, "num_samples", None)
    first_size = fit[0].get("num_examples") if fit else None
    shrunk = isinstance(samples, int) and isinstance(first_size, int) and samples < first_size
    if plan is None or not fit or (cadence <= 1 and not shrunk):
        return None
    audited = sorted({r["epoch"] for r in fit})
    end = max(audited[-1], last_epoch if last_epoch is not None else audited[-1])
    skipped = [e for e in range(audited[0], end + 1) if e not in audited]
    budget = getattr(audit, "budget", None)
    every = int(getattr(audit, "every_n_epochs", 0) or 0)
    text = (
        f"{getattr(audit, 'log_prefix', type(audit).__name__)}: the cost budget"
        + (f" ({budget:.0%} of training time)" if isinstance(budget, float) else "")
        + " changed the audit — "
    )
    changes = []
    if cadence > 1:
        changes.append(
            f"every {every * cadence} epochs instead of every {every}"
            if every
            else f"every {cadence}-th scheduled step instead of every one"
        )
    if shrunk:
        changes.append(f"{samples} examples instead of {first_size} after the first audit")
    text += ", ".join(changes) + f" (predicted share {plan.share:.1%}" + ("" if plan.fits else ", still over it") + ")."
    if every and skipped:
        text += f" Epochs audited: {_epochs(audited)}; not audited: {_epochs(skipped)}."
    return text


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
        >>> from types import SimpleNamespace
        >>> Audit.plan, Audit.budget, Audit.every_n_epochs = SimpleNamespace(cadence=3, num_samples=256,
        ...                                                                  share=0.04, fits=True), 0.05, 1
        >>> headline_sentences([Audit()], [{"epoch": 4, "metrics": {"train_loss": 0.5}}])["training"]
        ['Training, epoch 4: train_loss 0.5.', 'Audit schedule — Audit: the cost budget (5% of training time) changed the audit — every 3 epochs instead of every 1 (predicted share 4.0%). Epochs audited: 0; not audited: 1, 2, 3, 4.']
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
        out["erasure"] = [
            "Absent: no erasure audit ran (add ErasureAudit with rankings attention, random and a saliency method)."
        ]
    if training:
        last = training[-1]
        shown = [
            (k, v)
            for k, v in last["metrics"].items()
            if split_stage(k)[0] is not None
            and any(word in split_stage(k)[1] for word in ("acc", "loss", "f1", "auroc"))
            and _finite(v)
        ]
        if shown:
            out["training"] = [
                f"Training, epoch {last['epoch']}: " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(shown)) + "."
            ]
    if not out["training"]:
        out["training"] = ["Absent: no training metric was logged (train/loss, train_loss, val_acc, …)."]
    last_epoch = max((r["epoch"] for r in training if isinstance(r.get("epoch"), int)), default=None)
    for audit in audits:
        line = _schedule(audit, last_epoch) if getattr(audit, "history", None) else None
        if line:
            out["training"].append("Audit schedule — " + line)
    return out


def headline_html(audits: Sequence[Any], training: Sequence[Mapping[str, Any]] = ()) -> str:
    """The headline block (``<section id="headline">``) of :func:`headline_sentences`, escaped."""
    words = headline_sentences(audits, training)
    titles = {
        "agreement": "Does attention agree with faithful maps?",
        "erasure": "Does erasing what attention ranks first matter more than random?",
        "training": "Training",
    }
    parts = ['<section id="headline" class="headline"><h2>Headline</h2>']
    for topic, lines in words.items():
        parts.append(
            f'<div class="claim" data-topic="{topic}"><h3>{_esc(titles[topic])}</h3>'
            + "".join(f"<p>{_esc(line)}</p>" for line in lines)
            + "</div>"
        )
    parts.append("</section>")
    return "".join(parts)

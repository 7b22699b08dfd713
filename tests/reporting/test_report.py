"""The HTML report (DOM, escaping, self-containment), PNGs, the summary table, and a headless Chromium render."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest
import torch

from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, AuditExample, AuditResult, ErasureAudit
from lightning_xai.reporting import (
    AuditReport,
    final_results,
    format_summary,
    plot_heatmap,
    plot_histograms,
    plot_history,
    print_summary,
    score_colour,
    token_heatmap_html,
    write_report,
)
from lightning_xai.reporting.summary import pick_record

HOSTILE = [
    '<script>document.body.setAttribute("data-pwned","1")</script>',
    '<img src=x onerror="alert(1)">',
    '"quoted"',
    "a&b",
    "good",
]


class _Dom(HTMLParser):
    """Collects the elements of a page: tags with attributes, and the text of every token span."""

    def __init__(self):
        super().__init__()
        self.tags, self.tokens, self.stack = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.stack.append((tag, dict(attrs), []))

    def handle_endtag(self, tag):
        while self.stack:
            open_tag, attrs, text = self.stack.pop()
            if open_tag == "span" and "tok" in attrs.get("class", ""):
                self.tokens.append(("".join(text), attrs))
            if open_tag == tag:
                break

    def handle_data(self, data):
        for _, _, text in self.stack:
            text.append(data)


def _audit_with_result(history_epochs=(0, 1, 2)):
    audit = AttentionAudit(methods=("integrated_gradients", "leave_one_out"), metrics=("kendall_tau",))
    audit.history = [
        {
            "stage": "fit",
            "epoch": e,
            "global_step": 10 * (e + 1),
            "split": "val",
            "num_examples": 2,
            "metrics": {
                "kendall_tau/attention_vs_leave_one_out/mean": 0.1 * e,
                "kendall_tau/attention_vs_leave_one_out/std": 0.05,
                "kendall_tau/attention_vs_leave_one_out/significant_fraction": 0.5,
            },
        }
        for e in history_epochs
    ]
    examples = [
        AuditExample(
            position=0,
            index=7,
            split="val",
            token_ids=[4, 5, 6, 7, 8],
            label=1,
            prediction=1,
            probability=0.9,
            tokens=list(HOSTILE),
            maps={
                "attention": [0.1, 0.2, 0.3, 0.1, 0.3],
                "integrated_gradients": [-0.5, 0.2, 1.0, 0.0, 0.1],
                "leave_one_out": [0.0, 0.01, 0.2, 0.0, 0.05],
            },
            values={"kendall_tau/attention_vs_leave_one_out": 0.4},
        ),
        AuditExample(
            position=1,
            index=9,
            split="val",
            token_ids=[4, 5],
            label=0,
            prediction=1,
            probability=0.6,
            tokens=["fine", "film"],
            maps={"attention": [0.5, 0.5], "integrated_gradients": [0.1, 0.2], "leave_one_out": [0.1, 0.0]},
            values={"kendall_tau/attention_vs_leave_one_out": -0.2},
        ),
    ]
    audit.latest = AuditResult(
        stage="fit", epoch=2, global_step=30, split="val", metrics=audit.history[-1]["metrics"], examples=examples
    )
    return audit


def test_token_text_is_escaped_and_nothing_can_run(tmp_path):
    path = write_report([_audit_with_result()], str(tmp_path), png=True)
    page = open(path, encoding="utf-8").read()
    dom = _Dom()
    dom.feed(page)
    tags = [t for t, _ in dom.tags]
    assert "script" not in tags and "img" in tags  # the only <img> are our embedded PNGs
    assert all(a.get("src", "").startswith("data:image/png;base64,") for t, a in dom.tags if t == "img")
    assert not any(k.startswith("on") for _, a in dom.tags for k in a)  # no event handler attribute anywhere
    assert "http://" not in page and "https://" not in page and 'src="//' not in page  # no CDN, nothing remote
    csp = [a for t, a in dom.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]["content"]
    # the hostile strings come back as text, exactly
    texts = [text for text, _ in dom.tokens]
    for token in HOSTILE:
        assert texts.count(token) == 3  # one cell per map (attention, IG, LOO)


def test_heatmap_has_a_row_per_map_legend_and_colour_scale(tmp_path):
    path = write_report([_audit_with_result()], str(tmp_path), png=False)
    page = open(path, encoding="utf-8").read()
    dom = _Dom()
    dom.feed(page)
    assert any(a.get("id") == "legend" for _, a in dom.tags)
    scale = [a for _, a in dom.tags if a.get("class") == "scale"]
    assert scale and "linear-gradient" in scale[0]["style"]
    maps = [a for t, a in dom.tags if t == "td" and a.get("class") == "map"]
    assert len(maps) == 6  # 2 examples x (attention, IG, LOO)
    # colour encodes |score| / max |score| per row; sign picks the hue
    spans = {(text, attrs["title"].split(":")[0]): attrs for text, attrs in dom.tokens}
    ig_top = spans[(HOSTILE[2], "integrated_gradients")]["style"]
    assert "rgba(33,102,172,1.000)" in ig_top  # the largest IG score: full blue
    assert "rgba(178,24,43,0.500)" in spans[(HOSTILE[0], "integrated_gradients")]["style"]  # -0.5 of max 1: half red
    assert score_colour(0.0, 1.0).endswith("0.000)")
    # the history table and the latest values are there
    assert "0.2000" in page and "kendall_tau/attention_vs_leave_one_out" in page


def test_pngs_are_real_images(tmp_path):
    audit = _audit_with_result()
    paths = [
        plot_history(audit.history, ["kendall_tau/attention_vs_leave_one_out"], str(tmp_path / "h.png")),
        plot_histograms({"tau": [0.1, 0.5, -0.2]}, str(tmp_path / "hist.png")),
        plot_heatmap(
            HOSTILE, {"attention": [0.1, 0.2, 0.3, 0.1, 0.3], "ig": [-1, 0, 1, 2, 0]}, str(tmp_path / "m.png")
        ),
    ]
    for path in paths:
        with open(path, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="scores for"):
        plot_heatmap(["a"], {"attention": [0.1, 0.2]}, str(tmp_path / "bad.png"))
    with pytest.raises(ValueError, match="scores for"):
        token_heatmap_html(["a"], {"attention": [0.1, 0.2]})


def test_report_callback_writes_into_the_run_directory(kit, tmp_path):
    from pytorch_lightning.loggers import CSVLogger

    dm = kit.make_dm()
    audit = AttentionAudit(methods=("gradient", "leave_one_out"), metrics=("kendall_tau",), num_samples=6)
    report = AuditReport(max_examples=3, heatmap_pngs=2)
    logger = CSVLogger(tmp_path, name="run")
    kit.make_trainer(tmp_path, [report, audit], max_epochs=2, logger=logger).fit(kit.make_model(dm), dm)
    directory = os.path.join(logger.log_dir, "xai_report")
    assert report.report_path == os.path.join(directory, "report.html")
    files = sorted(os.listdir(directory))
    assert "attention_audit_kendall_tau_over_epochs.png" in files and "attention_audit_histograms.png" in files
    assert sum(f.startswith("attention_audit_heatmap_val_") for f in files) == 2
    dom = _Dom()
    dom.feed(open(report.report_path, encoding="utf-8").read())
    words = dm.tokens("val", audit.latest.examples[0].index)
    shown = [text for text, attrs in dom.tokens if attrs["title"].startswith("attention:")]
    assert shown[: len(words)] == words  # tokens come from the data module
    assert "Kendall τ attention ↔ gradient" in report.summary()  # what the CLI prints after testing


def test_summary_table_from_histories():
    audit = AttentionAudit(methods=("gradient", "leave_one_out"), metrics=("kendall_tau", "jsd"))
    audit.history = [
        {
            "stage": "fit",
            "epoch": 3,
            "global_step": 9,
            "split": "val",
            "num_examples": 256,
            "metrics": {"kendall_tau/attention_vs_gradient/mean": 0.9},
        },
        {
            "stage": "test",
            "epoch": 4,
            "global_step": 9,
            "split": "test",
            "num_examples": 256,
            "metrics": {
                "kendall_tau/attention_vs_gradient/mean": 0.35,
                "kendall_tau/attention_vs_gradient/std": 0.2,
                "kendall_tau/attention_vs_gradient/significant_fraction": 0.41,
                "kendall_tau/gradient_vs_leave_one_out/mean": 0.66,
                "kendall_tau/gradient_vs_leave_one_out/std": 0.1,
                "jsd/attention_vs_gradient/mean": 0.2,
                "jsd/attention_vs_gradient/std": 0.1,
            },
        },
    ]
    erasure = ErasureAudit(rankings=("attention", "random"))
    erasure.history = [
        {
            "stage": "fit",
            "epoch": 1,
            "global_step": 2,
            "split": "val",
            "num_examples": 8,
            "metrics": {
                "attention/flipped/mean": 0.25,
                "attention/fraction_removed/mean": 0.5,
                "attention/fraction_removed/std": 0.1,
                "attention/comprehensiveness/mean": 0.2,
                "attention/comprehensiveness/std": 0.05,
            },
        }
    ]
    baselines = AttentionBaselines()
    baselines.history = [
        {
            "stage": "fit",
            "epoch": 1,
            "global_step": 2,
            "split": "val",
            "num_examples": 8,
            "metrics": {
                "uniform/accuracy_trained": 0.8,
                "uniform/accuracy_uniform": 0.78,
                "uniform/accuracy_delta": -0.02,
                "uniform/f1_delta": -0.03,
                "uniform/flip_fraction": 0.05,
                "permutation/median_delta": 0.0123,
                "permutation/bin[0.00,0.10)/median_delta": 0.01,
                "permutation/bin[0.00,0.10)/count": 8.0,
            },
        }
    ]
    rows = final_results([audit, erasure, baselines, object()], {"test/acc": torch.tensor(0.8125)})
    table = dict((q, v) for q, v, _ in rows)
    assert table["test accuracy"] == "0.8125"
    assert table["Kendall τ attention ↔ gradient"] == "0.350 ± 0.200 (sig. 0.41)"  # the test record wins
    assert table["Kendall τ gradient ↔ leave_one_out"] == "0.660 ± 0.100"
    assert table["decision flip [attention]: fraction flipped"] == "0.250"
    assert table["comprehensiveness [attention]"] == "0.200 ± 0.050"
    assert table["uniform attention: accuracy trained → uniform"] == "0.800 → 0.780 (Δ -0.020)"
    assert table["permutation: median |Δŷ|"] == "0.0123"
    assert "JSD attention ↔ gradient" not in table  # Kendall τ only unless full=True
    assert not any(q.startswith("aopc") for q in table)
    full = dict((q, v) for q, v, _ in final_results([audit, erasure], full=True))
    assert full["JSD attention ↔ gradient"] == "0.200 ± 0.100"
    text = format_summary(rows)
    assert text.splitlines()[0] == "lightning_xai — final results" and "test, epoch 4, n=256" in text
    assert print_summary([audit], {"test/acc": 0.5}, file=open(os.devnull, "w")).count("\n") >= 2
    assert pick_record([]) is None


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
_CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Appended to a copy of a page (with its CSP relaxed for this one script): measures the layout at 1400 px and writes
# the result into the DOM, which --dump-dom prints. The report itself runs no script.
_MEASURE = """<script>
const over = [...document.querySelectorAll('body *')].filter(e => !e.closest('.wide')
  && e.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5)
  .map(e => e.tagName + '.' + e.className).slice(0, 10);
document.body.setAttribute('data-measure', JSON.stringify({scrollWidth: document.documentElement.scrollWidth,
  clientWidth: document.documentElement.clientWidth, over: over,
  headline: !!document.getElementById('headline'), curves: !!document.querySelector('#curves figure img'),
  erasure: !!document.querySelector('#erasure-comparison img'),
  broken: [...document.images].filter(i => !i.complete || i.naturalWidth === 0).length,
  longRows: document.querySelectorAll('tr.long').length}));
</script>"""


def _chromium(tmp_path, *args):
    run = subprocess.run(
        [CHROMIUM, *_CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run


def _measure_at_1400(tmp_path, report_path):
    import json
    import re

    page = open(report_path, encoding="utf-8").read()
    page = page.replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';", 1)
    probe = tmp_path / ("probe_" + os.path.basename(os.path.dirname(report_path)) + ".html")
    probe.write_text(page.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    dom = _chromium(
        tmp_path, "--window-size=1400,1000", "--virtual-time-budget=5000", "--dump-dom", f"file://{probe}"
    ).stdout
    found = re.search(r'data-measure="([^"]*)"', dom)
    assert found, dom[-2000:]
    return json.loads(html_unescape(found.group(1)))


def html_unescape(text):
    import html

    return html.unescape(text)


def _eraser_report(tmp_path):
    """A real audit of two bundled ERASER movie reviews (~700 words each) by an untrained tiny model."""
    import pytorch_lightning as pl

    from lightning_xai.data import TextClassificationDataModule
    from lightning_xai.models import AttentionClassifier

    class Reviews(TextClassificationDataModule):
        def examples(self, split):
            return super().examples(split)[:4]

    dm = Reviews("eraser_movies", batch_size=2, seed=0)
    dm.setup("validate")
    pl.seed_everything(0, verbose=False)
    model = AttentionClassifier(dm.vocab_size, 2, embedding_dim=8, hidden_dim=4, vocab=dm.vocab.itos)
    report = AuditReport(dirpath=str(tmp_path / "eraser"), heatmap_pngs=0, max_examples=2)
    audit = AttentionAudit(methods=("gradient", "grad_x_input"), metrics=("kendall_tau",), num_samples=2)
    pl.Trainer(
        callbacks=[audit, report],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    ).validate(model, dm)
    assert min(len(e.tokens) for e in audit.latest.examples) > 300
    return report.report_path


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="headless Chromium (Debian package 'chromium') not installed")
def test_report_renders_in_headless_chromium_and_scripts_do_not_run(tmp_path, audited_run):
    from matplotlib.image import imread

    path = write_report([_audit_with_result()], str(tmp_path / "report"), png=True)
    dom = _chromium(tmp_path, "--dump-dom", f"file://{path}")
    assert "<body>" in dom.stdout and 'data-pwned="1"' not in dom.stdout  # the injected script never ran
    assert "&lt;script&gt;" in dom.stdout
    shot = tmp_path / "shot.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,900", f"file://{path}")
    pixels = imread(str(shot))[..., :3]
    assert pixels.shape[0] == 900 and pixels.shape[1] == 1200
    # the page is not blank: the heatmap blue and the legend's red are painted
    blue = (
        (abs(pixels[..., 0] - 33 / 255) < 0.08)
        & (abs(pixels[..., 1] - 102 / 255) < 0.08)
        & (abs(pixels[..., 2] - 172 / 255) < 0.08)
    ).sum()
    red = (
        (abs(pixels[..., 0] - 178 / 255) < 0.1)
        & (abs(pixels[..., 1] - 24 / 255) < 0.1)
        & (abs(pixels[..., 2] - 43 / 255) < 0.1)
    ).sum()
    assert blue > 50 and red > 20

    # Issue 20: a real run's report at 1400 px — headline, curves and erasure comparison present, nothing wider
    # than the window, no console error; an ERASER review (~700 words, one row per map) wraps inside the page.
    real = audited_run.report.report_path
    measured = _measure_at_1400(tmp_path, real)
    assert measured["headline"] and measured["curves"] and measured["erasure"], measured
    assert measured["scrollWidth"] <= 1400 and not measured["over"] and measured["broken"] == 0, measured
    reviews = _measure_at_1400(tmp_path, _eraser_report(tmp_path))
    assert reviews["longRows"] >= 2 and reviews["scrollWidth"] <= 1400 and not reviews["over"], reviews
    logged = _chromium(
        tmp_path,
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1000",
        f"--screenshot={tmp_path / 'report_1400.png'}",
        f"file://{real}",
    )
    errors = [
        line for line in logged.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line or "Refused to" in line
    ]
    assert not errors, errors
    pixels = imread(str(tmp_path / "report_1400.png"))[..., :3]
    assert pixels.shape[:2] == (1000, 1400) and pixels.std() > 0.05  # a page was painted, not a blank window
    keep = os.environ.get("LIGHTNING_XAI_ARTEFACTS", os.path.join(tempfile.gettempdir(), "lightning_xai_artefacts"))
    os.makedirs(keep, exist_ok=True)
    shutil.copy(tmp_path / "report_1400.png", os.path.join(keep, "report_1400.png"))
    print(f"report screenshot (1400 px): {os.path.join(keep, 'report_1400.png')}")
    if os.environ.get("LIGHTNING_XAI_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["LIGHTNING_XAI_KEEP_SCREENSHOT"])


def test_plot_history_epoch_ticks_are_integers(tmp_path):
    """Issue 20: three audits (epochs 0..2) must not label the epoch axis 0.25, 0.5, ..."""
    from matplotlib.figure import Figure

    from lightning_xai.reporting import plots

    seen = {}
    original = plots._save

    def capture(fig: Figure, path: str) -> str:
        fig.canvas.draw() if fig.canvas is not None else None
        seen["ticks"] = [
            t for t in fig.axes[0].get_xticks() if fig.axes[0].get_xlim()[0] <= t <= fig.axes[0].get_xlim()[1]
        ]
        return original(fig, path)

    plots._save = capture
    try:
        history = [{"stage": "fit", "epoch": e, "metrics": {"tau/mean": 0.1 * e, "tau/std": 0.05}} for e in range(3)]
        assert plots.plot_history(history, ["tau"], str(tmp_path / "p.png")) is not None
    finally:
        plots._save = original
    assert seen["ticks"] and all(float(t).is_integer() for t in seen["ticks"]), seen["ticks"]

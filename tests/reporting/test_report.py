"""The HTML report (DOM, escaping, self-containment), PNGs, the summary table, and a headless Chromium render."""
from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
import torch

from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, AuditExample, AuditResult, ErasureAudit
from lightning_xai.reporting import (AuditReport, final_results, format_summary, plot_heatmap, plot_histograms,
                                     plot_history, print_summary, score_colour, token_heatmap_html, write_report)
from lightning_xai.reporting.summary import pick_record

HOSTILE = ['<script>document.body.setAttribute("data-pwned","1")</script>', '<img src=x onerror="alert(1)">',
           '"quoted"', "a&b", "good"]


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
    audit.history = [{"stage": "fit", "epoch": e, "global_step": 10 * (e + 1), "split": "val", "num_examples": 2,
                      "metrics": {"kendall_tau/attention_vs_leave_one_out/mean": 0.1 * e,
                                  "kendall_tau/attention_vs_leave_one_out/std": 0.05,
                                  "kendall_tau/attention_vs_leave_one_out/significant_fraction": 0.5}}
                     for e in history_epochs]
    examples = [
        AuditExample(position=0, index=7, split="val", token_ids=[4, 5, 6, 7, 8], label=1, prediction=1,
                     probability=0.9, tokens=list(HOSTILE),
                     maps={"attention": [0.1, 0.2, 0.3, 0.1, 0.3], "integrated_gradients": [-0.5, 0.2, 1.0, 0.0, 0.1],
                           "leave_one_out": [0.0, 0.01, 0.2, 0.0, 0.05]},
                     values={"kendall_tau/attention_vs_leave_one_out": 0.4}),
        AuditExample(position=1, index=9, split="val", token_ids=[4, 5], label=0, prediction=1, probability=0.6,
                     tokens=["fine", "film"], maps={"attention": [0.5, 0.5], "integrated_gradients": [0.1, 0.2],
                                                     "leave_one_out": [0.1, 0.0]},
                     values={"kendall_tau/attention_vs_leave_one_out": -0.2}),
    ]
    audit.latest = AuditResult(stage="fit", epoch=2, global_step=30, split="val", metrics=audit.history[-1]["metrics"],
                               examples=examples)
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
    assert "http://" not in page and "https://" not in page and "src=\"//" not in page  # no CDN, nothing remote
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
    paths = [plot_history(audit.history, ["kendall_tau/attention_vs_leave_one_out"], str(tmp_path / "h.png")),
             plot_histograms({"tau": [0.1, 0.5, -0.2]}, str(tmp_path / "hist.png")),
             plot_heatmap(HOSTILE, {"attention": [0.1, 0.2, 0.3, 0.1, 0.3], "ig": [-1, 0, 1, 2, 0]},
                          str(tmp_path / "m.png"))]
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
        {"stage": "fit", "epoch": 3, "global_step": 9, "split": "val", "num_examples": 256,
         "metrics": {"kendall_tau/attention_vs_gradient/mean": 0.9}},
        {"stage": "test", "epoch": 4, "global_step": 9, "split": "test", "num_examples": 256,
         "metrics": {"kendall_tau/attention_vs_gradient/mean": 0.35, "kendall_tau/attention_vs_gradient/std": 0.2,
                     "kendall_tau/attention_vs_gradient/significant_fraction": 0.41,
                     "kendall_tau/gradient_vs_leave_one_out/mean": 0.66,
                     "kendall_tau/gradient_vs_leave_one_out/std": 0.1,
                     "jsd/attention_vs_gradient/mean": 0.2, "jsd/attention_vs_gradient/std": 0.1}}]
    erasure = ErasureAudit(rankings=("attention", "random"))
    erasure.history = [{"stage": "fit", "epoch": 1, "global_step": 2, "split": "val", "num_examples": 8,
                        "metrics": {"attention/flipped/mean": 0.25, "attention/fraction_removed/mean": 0.5,
                                    "attention/fraction_removed/std": 0.1, "attention/comprehensiveness/mean": 0.2,
                                    "attention/comprehensiveness/std": 0.05}}]
    baselines = AttentionBaselines()
    baselines.history = [{"stage": "fit", "epoch": 1, "global_step": 2, "split": "val", "num_examples": 8,
                          "metrics": {"uniform/accuracy_trained": 0.8, "uniform/accuracy_uniform": 0.78,
                                      "uniform/accuracy_delta": -0.02, "uniform/f1_delta": -0.03,
                                      "uniform/flip_fraction": 0.05, "permutation/median_delta": 0.0123,
                                      "permutation/bin[0.00,0.10)/median_delta": 0.01,
                                      "permutation/bin[0.00,0.10)/count": 8.0}}]
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


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="headless Chromium (Debian package 'chromium') not installed")
def test_report_renders_in_headless_chromium_and_scripts_do_not_run(tmp_path):
    from matplotlib.image import imread

    path = write_report([_audit_with_result()], str(tmp_path / "report"), png=True)
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(common + ["--dump-dom", f"file://{path}"], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<body>" in dom.stdout and 'data-pwned="1"' not in dom.stdout  # the injected script never ran
    assert "&lt;script&gt;" in dom.stdout
    shot = tmp_path / "shot.png"
    run = subprocess.run(common + [f"--screenshot={shot}", "--window-size=1200,900", f"file://{path}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    pixels = imread(str(shot))[..., :3]
    assert pixels.shape[0] == 900 and pixels.shape[1] == 1200
    # the page is not blank: the heatmap blue and the legend's red are painted
    blue = ((abs(pixels[..., 0] - 33 / 255) < 0.08) & (abs(pixels[..., 1] - 102 / 255) < 0.08)
            & (abs(pixels[..., 2] - 172 / 255) < 0.08)).sum()
    red = ((abs(pixels[..., 0] - 178 / 255) < 0.1) & (abs(pixels[..., 1] - 24 / 255) < 0.1)
           & (abs(pixels[..., 2] - 43 / 255) < 0.1)).sum()
    assert blue > 50 and red > 20
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
        seen["ticks"] = [t for t in fig.axes[0].get_xticks() if fig.axes[0].get_xlim()[0] <= t <= fig.axes[0].get_xlim()[1]]
        return original(fig, path)

    plots._save = capture
    try:
        history = [{"stage": "fit", "epoch": e, "metrics": {"tau/mean": 0.1 * e, "tau/std": 0.05}} for e in range(3)]
        assert plots.plot_history(history, ["tau"], str(tmp_path / "p.png")) is not None
    finally:
        plots._save = original
    assert seen["ticks"] and all(float(t).is_integer() for t in seen["ticks"]), seen["ticks"]

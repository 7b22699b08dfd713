"""Issue 20: the report a person opens first — headline in words, training curves beside the audits, erasure
rankings on one axes, one report per run (also inside an offline W&B run), readable word pieces."""

from __future__ import annotations

import csv
import glob
import os
import re
from html.parser import HTMLParser

from lightning_xai.callbacks import AttentionAudit, AuditExample, AuditResult
from lightning_xai.reporting import AuditReport, merge_word_pieces, plots, write_report
from lightning_xai.reporting.curves import agreement_panels, erasure_panels


class _Sections(HTMLParser):
    """The text inside each element with an id (nested ids each get the text)."""

    def __init__(self):
        super().__init__()
        self.text, self.stack, self.ids = {}, [], []

    def handle_starttag(self, tag, attrs):
        ident = dict(attrs).get("id")
        self.stack.append(ident)
        if ident:
            self.ids.append(ident)
            self.text.setdefault(ident, "")

    def handle_endtag(self, tag):
        if self.stack:
            self.stack.pop()

    def handle_data(self, data):
        for ident in self.stack:
            if ident:
                self.text[ident] += data


def _sections(path):
    parser = _Sections()
    parser.feed(open(path, encoding="utf-8").read())
    return parser


def _csv_by_epoch(logger, key):
    """The last logged value of ``key`` in each epoch, read back from the CSVLogger's own metrics.csv."""
    out = {}
    with open(os.path.join(logger.log_dir, "metrics.csv"), newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get(key):
                out[int(row["epoch"])] = float(row[key])
    return out


def test_headline_states_the_latest_audit_in_words_with_its_numbers(audited_run):
    page = _sections(audited_run.report.report_path)
    assert page.ids[0] == "headline"  # the first thing on the page, before any table
    words = re.sub(r"\s+", " ", page.text["headline"])
    latest = audited_run.audit.history[-1]["metrics"]
    first = audited_run.audit.history[0]["metrics"]
    for method in ("gradient", "leave_one_out"):
        key = f"kendall_tau/attention_vs_{method}"
        assert f"{method} {latest[key + '/mean']:.3f} ± {latest[key + '/std']:.3f}" in words
        assert f"({latest[key + '/significant_fraction']:.0%} of examples significant at p ≤ 0.05)" in words
        assert (
            f"{first[key + '/mean']:.3f} at the first audit (fit, epoch 0) → {latest[key + '/mean']:.3f} at epoch 1"
            in words
        )
    erased = audited_run.erasure.history[-1]["metrics"]
    comp = {r: erased[f"{r}/comprehensiveness/mean"] for r in ("attention", "attention_gradient", "random")}
    assert (
        f"attention {comp['attention']:.3f}, random {comp['random']:.3f}, best saliency ranking "
        f"(attention_gradient) {comp['attention_gradient']:.3f}"
    ) in words
    verdict = "beats" if comp["attention"] > comp["random"] else "does not beat"
    assert f"Attention {verdict} random ({comp['attention'] - comp['random']:+.3f})" in words
    val_acc = _csv_by_epoch(audited_run.logger, "val/acc")
    assert f"val/acc {val_acc[max(val_acc)]:.4g}" in words


def test_headline_says_what_is_absent(tmp_path):
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",))
    audit.history = [
        {
            "stage": "fit",
            "epoch": 0,
            "global_step": 3,
            "split": "val",
            "num_examples": 4,
            "metrics": {"kendall_tau/attention_vs_gradient/mean": 0.25},
        }
    ]
    words = _sections(write_report([audit], str(tmp_path), png=False)).text["headline"]
    assert "gradient 0.250" in words and "Only one audit so far" in words
    assert "Absent: no erasure audit ran" in words and "Absent: no training metric" in words


def test_training_curves_are_the_logged_metrics_on_the_audit_epoch_axis(audited_run):
    records = audited_run.report.training_log.records
    assert [r["epoch"] for r in records] == [0, 1]
    for key in ("val/acc", "val/loss", "train/loss"):
        logged = _csv_by_epoch(audited_run.logger, key)  # what the CSVLogger wrote, per epoch
        assert {r["epoch"]: round(r["metrics"][key], 6) for r in records} == {e: round(v, 6) for e, v in logged.items()}
    assert not any(k.startswith(("attention_audit/", "erasure_audit/")) for r in records for k in r["metrics"])
    page = _sections(audited_run.report.report_path)
    assert {"curves", "erasure-comparison"} <= set(page.ids)
    html = open(audited_run.report.report_path, encoding="utf-8").read()
    curves = html[html.index('id="curves"') : html.index('id="legend"')]
    assert curves.count("<img") == 1 and "data:image/png;base64," in curves
    assert os.path.exists(os.path.join(os.path.dirname(audited_run.report.report_path), "training_and_audits.png"))


def test_one_axes_per_comparison_with_integer_epoch_ticks(audited_run, tmp_path):
    """Erasure: every ranking on the same axes; agreement: one pair per axes (bands never pile up)."""
    seen = []
    original = plots._save

    def capture(fig, path):
        fig.canvas.draw()
        seen.append(
            [
                (
                    ax.get_title(),
                    [line.get_label() for line in ax.get_lines()],
                    [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]],
                    len(ax.collections),
                )
                for ax in fig.axes
                if ax.get_visible()
            ]
        )
        return original(fig, path)

    plots._save = capture
    try:
        plots.plot_panels(erasure_panels(audited_run.erasure.history), str(tmp_path / "erasure.png"))
        plots.plot_panels(agreement_panels(audited_run.audit.history, "a")["kendall_tau"], str(tmp_path / "tau.png"))
    finally:
        plots._save = original
    erasure, agreement = seen
    comp = next(ax for ax in erasure if ax[0] == "comprehensiveness: every ranking")
    assert (
        comp[1] == ["attention/comprehensiveness", "attention_gradient/comprehensiveness", "random/comprehensiveness"]
        and comp[3] == 0
    )  # three rankings, one axes, no bands
    assert sorted(ax[0] for ax in agreement) == [
        "a: attention ↔ gradient",
        "a: attention ↔ leave_one_out",
        "a: gradient ↔ leave_one_out",
    ]
    assert all(len(ax[1]) == 1 and ax[3] == 1 for ax in agreement)  # one series and its ±std band per axes
    for ax in erasure + agreement:
        assert ax[2] and all(float(t).is_integer() for t in ax[2]), ax


def _short_fit(kit, root, epochs, **trainer_options):
    dm = kit.make_dm(train=32, val=16)
    report = AuditReport(png=False)
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=4, every_n_epochs=1)
    kit.make_trainer(root, [audit, report], max_epochs=epochs, **trainer_options).fit(kit.make_model(dm), dm)
    return report


def test_two_runs_with_the_same_save_dir_keep_two_reports(kit, tmp_path):
    from pytorch_lightning.loggers import CSVLogger

    first, second = (_short_fit(kit, tmp_path / "plain", e) for e in (1, 2))  # no logger: default_root_dir
    assert first.report_path != second.report_path
    assert [os.path.relpath(r.report_path, tmp_path) for r in (first, second)] == [
        "plain/xai_report/version_0/report.html",
        "plain/xai_report/version_1/report.html",
    ]
    assert "latest audit: epoch 0" in open(first.report_path, encoding="utf-8").read()  # not overwritten
    assert "latest audit: epoch 1" in open(second.report_path, encoding="utf-8").read()
    logged = [_short_fit(kit, tmp_path, 1, logger=CSVLogger(str(tmp_path), name="csv")) for _ in range(2)]
    assert [os.path.relpath(r.report_path, tmp_path) for r in logged] == [
        "csv/version_0/xai_report/report.html",
        "csv/version_1/xai_report/report.html",
    ]


def test_the_offline_wandb_run_holds_the_report(kit, tmp_path):
    from pytorch_lightning.loggers import WandbLogger

    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="lightning-xai-tests")
    report = _short_fit(kit, tmp_path, 1, logger=logger)
    run_dir = os.path.dirname(logger.experiment.dir)
    logger.experiment.finish()
    assert os.path.basename(run_dir).startswith("offline-run-")
    assert report.report_path.startswith(run_dir + os.sep)  # the page lives in the run's own folder
    media = glob.glob(os.path.join(run_dir, "files", "media", "html", "xai_report_*.html"))
    assert media, sorted(glob.glob(os.path.join(run_dir, "**"), recursive=True))  # and is W&B Html media
    assert 'id="headline"' in open(media[0], encoding="utf-8").read()


def test_word_pieces_of_a_real_tokenizer_merge_into_words_with_summed_scores(tmp_path):
    from transformers import AutoTokenizer

    from lightning_xai.models.embeddings import _minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(str(_minilm_dir(None)))
    pieces = ["[CLS]", *tokenizer.tokenize("an unbelievably charming , overlong documentary"), "[SEP]"]
    scores = [float(i) for i in range(len(pieces))]
    words, maps = merge_word_pieces(pieces, {"attention": scores})
    assert words == ["[CLS]", "an", "unbelievably", "charming", ",", "overlong", "documentary", "[SEP]"]
    starts = [i for i, p in enumerate(pieces) if not p.startswith("##")]
    ends = starts[1:] + [len(pieces)]
    assert maps["attention"] == [sum(scores[a:b]) for a, b in zip(starts, ends)]
    assert merge_word_pieces(["good", "film"], {"a": [1.0, 2.0]}) == (["good", "film"], {"a": [1.0, 2.0]})
    # in the report, as an option: the page shows the words, each with its summed score
    audit = AttentionAudit(methods=("gradient",))
    audit.history = [{"stage": "fit", "epoch": 0, "global_step": 1, "split": "val", "num_examples": 1, "metrics": {}}]
    example = AuditExample(
        position=0,
        index=0,
        split="val",
        token_ids=list(range(len(pieces))),
        label=1,
        prediction=1,
        probability=0.9,
        tokens=pieces,
        maps={"attention": scores},
    )
    audit.latest = AuditResult(stage="fit", epoch=0, global_step=1, split="val", metrics={}, examples=[example])
    merged = open(write_report([audit], str(tmp_path / "m"), png=False, merge_pieces=True), encoding="utf-8").read()
    plain = open(write_report([audit], str(tmp_path / "p"), png=False), encoding="utf-8").read()
    assert ">unbelievably</span>" in merged and ">##bel</span>" not in merged and ">##bel</span>" in plain
    assert f'title="attention: {maps["attention"][2]:.4g}" data-score="{maps["attention"][2]:.6g}"' in merged


def test_training_log_keeps_later_epochs_when_an_earlier_checkpoint_is_restored():
    """trainer.test(ckpt_path="best") after fitting restores the best epoch's callback state: no epoch is lost."""
    from lightning_xai.reporting import TrainingLog

    log, best = TrainingLog(), TrainingLog()
    for epoch in range(3):
        log.capture({"val/acc": 0.5 + epoch / 10}, epoch, 10 * (epoch + 1))
        if epoch <= 1:
            best.capture({"val/acc": 0.5 + epoch / 10}, epoch, 10 * (epoch + 1))
    log.load_state_dict(best.state_dict())
    assert [(r["epoch"], r["metrics"]["val/acc"]) for r in log.records] == [(0, 0.5), (1, 0.6), (2, 0.7)]
    resumed = TrainingLog()
    resumed.load_state_dict(best.state_dict())  # a new process resuming: the checkpoint's records come back
    assert resumed.records == best.records and resumed.records is not best.records

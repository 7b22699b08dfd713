"""Issue #31: the report of a generator audit. An unmodified LightningModule holding a tiny causal LM (Llama) or
encoder–decoder (BART), ``AttentionAudit()`` and ``AuditReport``: the page shows, for a few examples, a source tokens ×
target tokens heatmap of every map (attention and each method) with the words on both axes and the stored step maps
in its cells; an offline W&B run logs the same as a table (one row per cell) and as HTML heatmaps."""

from __future__ import annotations

import glob
import html
import json
import os
import re
import warnings

import pytest
import pytorch_lightning as pl

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.reporting import AuditReport
from lightning_xai.reporting.step_heatmaps import step_heatmap_html
from lightning_xai.reporting.wandb_logging import STEP_COLUMNS

KINDS = {"llama": True, "bart": False}  # kind -> causal


def fit(gen_kit, tmp_path, kind: str, callbacks, **trainer_options):
    Generation, Verses = gen_kit.classes()
    dm = Verses(causal=KINDS[kind])
    pl.seed_everything(0, verbose=False)
    module = Generation(kind, dm.word_ids, 0)
    trainer = gen_kit.make_trainer(tmp_path, callbacks, max_epochs=1, **trainer_options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    return dm


def block(page: str, start: str, end: str) -> str:
    at = page.index(start)
    return page[at : page.index(end, at)]


@pytest.mark.parametrize("kind", ["llama", "bart"])
def test_the_report_shows_source_by_target_heatmaps_with_the_words(gen_kit, tmp_path, kind):
    audit, report = AttentionAudit(), AuditReport(png=False)
    dm = fit(gen_kit, tmp_path, kind, [audit, report])
    page = open(report.report_path, encoding="utf-8").read()
    assert page.count("source tokens × target tokens</h4>") == 3  # a few examples: step_heatmaps=3
    example = audit.latest.examples[0]
    verse = dm.val_verses[example.index]
    steps = block(page, f'id="steps-attention_audit-val-{example.index}"', '<div class="heatmap">')
    assert f"target “{html.escape(' '.join([*verse.target, '</s>']))}”" in page  # the caption names the target
    for name in ("attention", "gradient", "grad_x_input"):
        table = block(steps, f'data-map="{name}"', "</table>")
        source = re.findall(r'title="source token \d+">([^<]*)</th>', table)
        target = re.findall(r'title="target step \d+">([^<]*)</th>', table)
        assert source == [html.escape(w) for w in verse.source]
        assert target == [html.escape(w) for w in [*verse.target, "</s>"]]
        cells = re.findall(r'data-score="([^"]+)"', table)
        assert cells == [f"{v:.6g}" for row in example.step_maps[name] for v in row]


def test_an_offline_wandb_run_logs_the_step_maps(gen_kit, tmp_path):
    pytest.importorskip("wandb")
    from pytorch_lightning.loggers import WandbLogger

    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="lightning-xai-tests")
    audit = AttentionAudit()
    dm = fit(gen_kit, tmp_path, "bart", [audit, AuditReport(png=False)], logger=logger)
    run_dir = os.path.dirname(logger.experiment.dir)
    logger.experiment.finish()
    files = glob.glob(os.path.join(run_dir, "files", "media", "table", "**", "step_maps_*.table.json"), recursive=True)
    assert len(files) == 1, sorted(glob.glob(os.path.join(run_dir, "**"), recursive=True))
    logged = json.load(open(files[0], encoding="utf-8"))
    assert logged["columns"] == STEP_COLUMNS
    shown = audit.latest.examples[:3]
    expected = [
        [e.index, name, k, e.target_tokens[k], i, e.tokens[i], v]
        for e in shown
        for name, rows in e.step_maps.items()
        for k, row in enumerate(rows)
        for i, v in enumerate(row)
    ]
    assert logged["data"] == expected
    assert {row[3] for row in logged["data"] if row[0] == shown[0].index} == {
        *dm.val_verses[shown[0].index].target,
        "</s>",
    }
    panels = glob.glob(os.path.join(run_dir, "files", "media", "html", "**", "step_heatmaps_*.html"), recursive=True)
    assert len(panels) == 1
    panel = open(panels[0], encoding="utf-8").read()
    assert all(f'data-map="{name}"' in panel for name in ("attention", "gradient", "grad_x_input"))
    assert f'title="target step 0">{html.escape(shown[0].target_tokens[0])}</th>' in panel


def test_step_heatmaps_is_a_count():
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    for bad in (-1, True):
        with pytest.raises(MisconfigurationException, match="step_heatmaps"):
            AuditReport(step_heatmaps=bad)


def test_source_word_pieces_merge_with_summed_scores_and_a_misshapen_map_is_refused():
    out = step_heatmap_html(
        ["Ġun", "believ", "Ġfilm"], ["x", "y"], {"gradient": [[1.0, 2.0, 4.0], [0.5, 0.25, 1.0]]}, merge_pieces=True
    )
    assert re.findall(r'title="source token \d+">([^<]*)</th>', out) == ["unbeliev", "film"]
    assert re.findall(r'data-score="([^"]+)"', out) == ["3", "4", "0.75", "1"]
    with pytest.raises(ValueError, match="step map 'gradient' is 1 × \\[3\\] for 2 target × 3 source tokens"):
        step_heatmap_html(["a", "b", "c"], ["x", "y"], {"gradient": [[1.0, 2.0, 3.0]]})

"""``make demo`` runs ``examples/configs/sst2.yaml`` with its audit callbacks: this test runs that exact config.

Only the sizes shrink (1 epoch of 2 batches, a small BiLSTM, 16-sentence audit subsets, 5 permutations) and the
output folders move under ``tmp_path``; the audit callbacks, the W&B + CSV loggers, ModelCheckpoint, EarlyStopping
and the report stay as the demo has them, so a demo whose audits stop logging fails here.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from lightning_xai.cli import main

DEMO = Path(__file__).resolve().parents[1] / "examples" / "configs" / "sst2.yaml"


@pytest.mark.slow
def test_demo_config_with_its_audits_logs_the_audit_keys_and_writes_the_report(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = tmp_path / "sst2.yaml"
    demo = yaml.safe_load(DEMO.read_text().replace("runs/demo", str(tmp_path / "demo")))
    audits = [c for c in demo["trainer"]["callbacks"] if c["class_path"].startswith("lightning_xai.callbacks.")]
    assert [c["class_path"].rsplit(".", 1)[1] for c in audits] == [
        "AttentionAudit",
        "ErasureAudit",
        "AttentionBaselines",
    ]
    for audit in audits:
        audit["init_args"]["num_samples"] = 16
    audits[2]["init_args"]["num_permutations"] = 5
    config.write_text(yaml.safe_dump(demo))
    main(
        [
            "fit",
            "--config",
            str(config),
            "--trainer.max_epochs",
            "1",
            "--trainer.limit_train_batches",
            "2",
            "--trainer.limit_val_batches",
            "2",
            "--trainer.limit_test_batches",
            "2",
            "--trainer.enable_progress_bar",
            "false",
            "--model.embedding_dim",
            "16",
            "--model.hidden_dim",
            "8",
        ]
    )

    metrics_files = sorted((tmp_path / "demo" / "csv").rglob("metrics.csv"))
    assert metrics_files, "the demo's CSVLogger wrote no metrics.csv"
    with open(metrics_files[-1], newline="") as handle:
        header = next(csv.reader(handle))
    audit_keys = [
        k
        for k in header
        if k.startswith(("attention_audit/", "erasure_audit/", "attention_baselines/", "test/attention_audit/"))
    ]
    assert audit_keys, f"no audit columns among the demo's logged keys {header}"
    assert any("kendall" in k or "tau" in k for k in audit_keys), audit_keys
    reports = list((tmp_path / "demo").rglob("report.html"))
    assert reports, "AuditReport wrote no report.html"
    assert "Kendall" in reports[0].read_text() or "τ" in reports[0].read_text()
    assert list((tmp_path / "demo").rglob("wandb/offline-run-*")), "the demo's offline W&B run is missing"

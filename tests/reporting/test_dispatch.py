"""Reporting reads audit callbacks through attributes and methods, never through their class names or imports."""

from __future__ import annotations

import ast
import os

import lightning_xai.reporting as reporting
from lightning_xai.callbacks import AttentionAudit, AuditCallback, BatchResult
from lightning_xai.reporting import AuditReport, final_results
from lightning_xai.reporting.protocol import ReportableAudit


class MyAttentionAudit(AttentionAudit):
    """A subclass under another name: the class-name dispatch of before gave it no Kendall rows."""


class Confidence(AuditCallback):
    """An audit callback reporting knows nothing about, with its own rows."""

    name = "confidence"

    def audit_batch(self, model, batch, generator, indices, prediction=None):
        return BatchResult(values={"top": prediction.probability}), {}

    def summary_rows(self, metrics, full=False):
        return [("top-class probability", "{top:mean_std}"), ("audited examples", "{n:int}")]


def _record(metrics):
    return [{"stage": "test", "epoch": 2, "global_step": 8, "split": "test", "num_examples": 5, "metrics": metrics}]


def test_rows_come_from_the_callbacks_own_method():
    renamed = MyAttentionAudit(methods=("gradient",), metrics=("kendall_tau",))
    renamed.history = _record(
        {"kendall_tau/attention_vs_gradient/mean": 0.4, "kendall_tau/attention_vs_gradient/std": 0.1}
    )
    new = Confidence()
    new.history = _record({"top/mean": 0.9, "top/std": 0.05, "n": 5.0})
    rows = {q: v for q, v, _ in final_results([renamed, new])}
    assert rows == {
        "Kendall τ attention ↔ gradient": "0.400 ± 0.100",
        "top-class probability": "0.900 ± 0.050",
        "audited examples": "5",
    }


def test_a_new_audit_callback_is_reported_end_to_end(kit, tmp_path):
    dm = kit.make_dm()
    audit = Confidence(num_samples=8)
    report = AuditReport(png=False)
    trainer = kit.make_trainer(tmp_path, [audit, report])
    trainer.fit(kit.make_model(dm), dm)
    assert report.audits(trainer) == [audit] and isinstance(audit, ReportableAudit)
    assert "top-class probability" in report.summary()
    assert "confidence" in open(report.report_path, encoding="utf-8").read()


def test_reporting_imports_no_callback_module():
    directory = os.path.dirname(reporting.__file__)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(directory, name), encoding="utf-8").read())
            imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
            imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            assert not any(m.startswith("lightning_xai.callbacks") for m in imported), name

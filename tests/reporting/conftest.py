"""Reuse the callback tests' SST-2 slices and tiny models (the ``kit`` fixture) and their tiny generators on the
bundled alignment corpus (``gen_kit``)."""

from __future__ import annotations

import importlib.util
import pathlib
import types

import pytest

_spec = importlib.util.spec_from_file_location(
    "_lightning_xai_callback_kit", pathlib.Path(__file__).resolve().parent.parent / "callbacks" / "conftest.py"
)
_kit_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kit_module)

kit = _kit_module.kit
gen_kit = _kit_module.gen_kit


@pytest.fixture(scope="session")
def audited_run(tmp_path_factory):
    """One real audited training run on an SST-2 slice (2 epochs, CSVLogger): agreement and erasure audits, report.

    Returns a namespace with ``report``, ``audit``, ``erasure``, ``logger``, ``dm``.
    """
    from pytorch_lightning.loggers import CSVLogger

    from lightning_xai.callbacks import AttentionAudit, ErasureAudit
    from lightning_xai.reporting import AuditReport

    root = tmp_path_factory.mktemp("audited_run")
    dm = _kit_module.make_dm(train=96, val=32)
    audit = AttentionAudit(
        methods=("gradient", "leave_one_out"), metrics=("kendall_tau",), num_samples=12, every_n_epochs=1
    )
    erasure = ErasureAudit(rankings=("attention", "attention_gradient", "random"), num_samples=12, every_n_epochs=1)
    report = AuditReport(max_examples=3, heatmap_pngs=1)
    logger = CSVLogger(str(root), name="run")
    trainer = _kit_module.make_trainer(root, [audit, erasure, report], max_epochs=2, logger=logger, log_every_n_steps=1)
    trainer.fit(_kit_module.make_model(dm), dm)
    return types.SimpleNamespace(report=report, audit=audit, erasure=erasure, logger=logger, dm=dm, trainer=trainer)

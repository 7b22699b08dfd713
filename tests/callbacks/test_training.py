"""End to end with real Trainers: non-invasiveness, resuming, loggers, bf16, W&B offline, DDP."""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

from lightning_xai.callbacks import AttentionAudit, AttentionBaselines, ErasureAudit, ImpermissibleAttentionMonitor
from lightning_xai.reporting import AuditReport


def _all_four(kit, num_samples=16):
    return [
        AttentionAudit(
            methods=("gradient", "grad_x_input", "integrated_gradients", "leave_one_out", "smooth_grad"),
            method_options={"integrated_gradients": {"n_steps": 8}, "smooth_grad": {"n_samples": 4}},
            num_samples=num_samples,
        ),
        ErasureAudit(rankings=("attention", "attention_gradient", "random"), num_samples=num_samples),
        AttentionBaselines(num_samples=num_samples, num_permutations=8),
        ImpermissibleAttentionMonitor(num_samples=num_samples),
    ]


def _train(kit, tmp_path, callbacks, epochs=2):
    dm = kit.make_dm(impermissible=True)
    model = kit.make_model(dm, dropout=0.3)  # dropout: training consumes the global RNG every step
    kit.make_trainer(tmp_path, callbacks, max_epochs=epochs).fit(model, dm)
    return model.state_dict()


class _Invasive(Callback):
    """A careless audit: draws from the global RNG and leaves the model in eval mode."""

    def on_validation_epoch_end(self, trainer, pl_module):
        torch.rand(1)


@pytest.mark.slow
def test_weights_are_bit_identical_with_all_four_callbacks(kit, tmp_path):
    plain = _train(kit, tmp_path / "plain", [])
    audits = _all_four(kit)
    audited = _train(kit, tmp_path / "audited", [*audits, AuditReport(png=False)])
    assert all(len(a.history) == 2 for a in audits)
    assert plain.keys() == audited.keys()
    for name in plain:
        assert torch.equal(plain[name], audited[name]), name
    # the check can fail: one stray draw from the global RNG changes the weights
    careless = _train(kit, tmp_path / "careless", [_Invasive()])
    assert any(not torch.equal(plain[name], careless[name]) for name in plain)


@pytest.mark.slow
def test_resume_from_a_mid_training_checkpoint_continues_the_history(kit, tmp_path):
    dm = kit.make_dm()
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=12)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1, filename="{epoch}")
    kit.make_trainer(tmp_path, [audit, checkpoint], max_epochs=2, enable_checkpointing=True).fit(kit.make_model(dm), dm)
    assert [r["epoch"] for r in audit.history] == [0, 1]

    resumed = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=12)
    trainer = kit.make_trainer(tmp_path, [resumed], max_epochs=3)
    trainer.fit(kit.make_model(dm, seed=1), dm, ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"))
    assert [r["epoch"] for r in resumed.history] == [0, 1, 2]  # nothing duplicated, nothing lost
    assert resumed.history[0] == audit.history[0]
    assert resumed.history[1]["global_step"] == audit.history[1]["global_step"]


@pytest.mark.slow
def test_csv_and_tensorboard_loggers_receive_the_audit(kit, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    dm = kit.make_dm()
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=8)
    csv, tb = CSVLogger(tmp_path, name="csv"), TensorBoardLogger(tmp_path, name="tb")
    kit.make_trainer(tmp_path, [audit], max_epochs=2, logger=[csv, tb]).fit(kit.make_model(dm), dm)
    key = "attention_audit/kendall_tau/attention_vs_gradient/mean"
    with open(os.path.join(csv.log_dir, "metrics.csv")) as handle:
        rows = handle.read().splitlines()
    column = rows[0].split(",").index(key)
    logged = [float(r.split(",")[column]) for r in rows[1:] if r.split(",")[column]]
    assert logged == pytest.approx([r["metrics"][key.split("/", 1)[1]] for r in audit.history])
    assert len(logged) == 2
    events = EventAccumulator(tb.log_dir)
    events.Reload()
    assert [e.value for e in events.Scalars(key)] == pytest.approx(logged, rel=1e-6)


def test_no_logger_warns_once(kit, tmp_path):
    dm = kit.make_dm()
    audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kit.make_trainer(tmp_path, [audit], max_epochs=2).fit(kit.make_model(dm), dm)
    assert sum("has no logger" in str(w.message) for w in caught) == 1
    assert len(audit.history) == 2


@pytest.mark.slow
def test_bf16_mixed_precision_on_cpu(kit, tmp_path):
    dm = kit.make_dm()
    audit = AttentionAudit(methods=("gradient", "leave_one_out"), metrics=("kendall_tau",), num_samples=12)
    erasure = ErasureAudit(rankings=("attention",), num_samples=12)
    kit.make_trainer(tmp_path, [audit, erasure], precision="bf16-mixed").fit(kit.make_model(dm), dm)
    values = {**audit.history[-1]["metrics"], **erasure.history[-1]["metrics"]}
    # fraction/attention removed are averaged over flipped examples: undefined (NaN) when none flipped
    undefined = {k for k in values if "_removed/" in k} if values["attention/flipped/mean"] == 0 else set()
    assert values and all(math.isfinite(v) for k, v in values.items() if k not in undefined)
    assert all(math.isnan(values[k]) for k in undefined)


@pytest.mark.slow
def test_wandb_offline_run_holds_the_table_and_html(kit, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from pytorch_lightning.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    dm = kit.make_dm()
    audit = AttentionAudit(
        methods=("integrated_gradients", "leave_one_out"),
        metrics=("kendall_tau",),
        method_options=kit.FAST_METHODS,
        num_samples=8,
    )
    logger = WandbLogger(save_dir=str(tmp_path), offline=True, project="lightning-xai-test")
    report = AuditReport(png=False)
    kit.make_trainer(tmp_path, [audit, report], logger=logger).fit(kit.make_model(dm), dm)
    run_dir = logger.experiment.dir
    logger.experiment.finish()
    tables = glob.glob(os.path.join(run_dir, "media", "table", "**", "*.table.json"), recursive=True)
    pages = glob.glob(os.path.join(run_dir, "media", "html", "**", "*.html"), recursive=True)
    assert tables and pages
    table = json.load(open(tables[0]))
    assert table["columns"][:5] == ["index", "tokens", "label", "prediction", "probability"]
    assert "scores/integrated_gradients" in table["columns"] and "scores/leave_one_out" in table["columns"]
    assert len(table["data"]) == 8
    first = dict(zip(table["columns"], table["data"][0]))
    words = dm.tokens("val", first["index"])
    assert first["tokens"] == " ".join(words)
    assert len(first["scores/attention"]) == len(words)  # numbers (a list per row), not a JSON string
    html_text = "".join(open(p).read() for p in pages)
    assert all(f">{w}<" in html_text for w in words if w.isalpha())
    assert "integrated_gradients" in html_text and "leave_one_out" in html_text
    assert os.path.exists(report.report_path)


_DDP_SCRIPT = textwrap.dedent("""
    import json, sys, torch, pytorch_lightning as pl
    sys.path.insert(0, {conftest_dir!r})
    from conftest import make_dm, make_model, make_trainer
    from lightning_xai.callbacks import AttentionAudit, AttentionBaselines
    torch.set_num_threads(1)
    dm = make_dm()
    model = make_model(dm)
    model.load_state_dict(torch.load({weights!r}))
    audit = AttentionAudit(methods=("gradient", "leave_one_out"), num_samples=20, batch_size=4)
    baselines = AttentionBaselines(num_samples=20, num_permutations=6)
    trainer = make_trainer({root!r}, [audit, baselines], accelerator="cpu", devices=2, strategy="ddp")
    trainer.validate(model, dm)
    out = {{"rank": trainer.global_rank, "world": trainer.world_size,
           "shard": sum(len(p) for p, _, _ in audit._audit_batches(trainer, "val")),
           "audit": audit.history, "baselines": baselines.history}}
    json.dump(out, open({root!r} + f"/rank{{trainer.global_rank}}.json", "w"))
    if torch.distributed.is_initialized():  # gloo torn down before exit (left to shutdown it can abort)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.ddp
def test_ddp_on_two_cpu_processes_equals_one_process(kit, tmp_path):
    dm = kit.make_dm()
    model = kit.make_model(dm)
    weights = str(tmp_path / "weights.pt")
    torch.save(model.state_dict(), weights)
    script = tmp_path / "ddp_audit.py"
    script.write_text(_DDP_SCRIPT.format(conftest_dir=os.path.dirname(__file__), weights=weights, root=str(tmp_path)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PL_DISABLE_FORK="1")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert [r["shard"] for r in ranks] == [10, 10]  # the audit subset is sharded ...

    audit = AttentionAudit(methods=("gradient", "leave_one_out"), num_samples=20, batch_size=4)
    baselines = AttentionBaselines(num_samples=20, num_permutations=6)
    kit.make_trainer(tmp_path / "single", [audit, baselines]).validate(model, dm)
    for rank in ranks:  # ... and every process holds what one process computes
        for name, single in (("audit", audit.history), ("baselines", baselines.history)):
            got = rank[name][0]["metrics"]
            want = single[0]["metrics"]
            assert got.keys() == want.keys()
            for key in want:
                if isinstance(want[key], float) and math.isnan(want[key]):
                    assert math.isnan(got[key]), key
                else:
                    assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        assert rank["audit"][0]["num_examples"] == 20

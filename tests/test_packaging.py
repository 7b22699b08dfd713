"""The package is described once: one version, the licence it declares, a changelog that names the version."""

from __future__ import annotations

import configparser
import re
from importlib.metadata import metadata, version
from pathlib import Path

import lightning_xai

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_written_once_and_the_installed_metadata_reads_it():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["metadata"]["version"].strip() == "attr: lightning_xai.__version__"
    assert version("lightning-xai") == lightning_xai.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", lightning_xai.__version__), "semver: MAJOR.MINOR.PATCH"


def test_the_declared_licence_is_the_licence_file():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    assert setup["metadata"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert metadata("lightning-xai")["License"] == "Apache-2.0"


def test_the_changelog_keeps_an_unreleased_section_and_the_current_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert headings[0] == "Unreleased"
    assert lightning_xai.__version__ in headings


def _public_classes(package: str, base: type) -> dict:
    """Classes subclassing ``base`` defined in the public modules of ``package`` (no ``_private`` part)."""
    import importlib
    import inspect
    import pkgutil

    found = {}
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            if (
                inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and issubclass(cls, base)
                and not name.startswith("_")
                and not inspect.isabstract(cls)
            ):
                found[name] = cls
    return found


def test_every_public_callback_loss_and_metric_class_is_exported_once_by_its_subpackage_and_the_top_level():
    import importlib

    import pytorch_lightning as pl
    import torch
    import torchmetrics

    from lightning_xai.callbacks import AuditCallback

    kinds = {
        "lightning_xai.callbacks": pl.Callback,
        "lightning_xai.losses": torch.nn.Module,
        "lightning_xai.metrics": torchmetrics.Metric,
    }
    counts = {}
    for package, base in kinds.items():
        classes = _public_classes(package, base)
        if package == "lightning_xai.callbacks":  # the building blocks of AuditCallback are not callbacks to use
            classes = {n: c for n, c in classes.items() if c not in AuditCallback.__mro__}
        subpackage = importlib.import_module(package)
        for name, cls in classes.items():
            assert subpackage.__all__.count(name) == 1, (
                f"{package}.__all__ lists {name} {subpackage.__all__.count(name)}×"
            )
            assert getattr(subpackage, name) is cls
            assert lightning_xai.__all__.count(name) == 1, f"lightning_xai.__all__ lacks {name}"
            assert getattr(lightning_xai, name) is cls
        counts[package] = len(classes)
    assert counts == {"lightning_xai.callbacks": 8, "lightning_xai.losses": 7, "lightning_xai.metrics": 14}


def test_the_top_level_names_each_thing_once_and_every_name_exists():
    assert len(lightning_xai.__all__) == len(set(lightning_xai.__all__))
    assert all(hasattr(lightning_xai, name) for name in lightning_xai.__all__)
    for name in (
        "attribute",
        "explanation_context",
        "ExplainableModel",
        "HookAdapter",
        "HuggingFaceAdapter",
        "TextClassificationDataModule",
        "HFTextClassificationDataModule",
        "AuditReport",
    ):
        assert name in lightning_xai.__all__


def test_no_module_serves_names_lazily():
    """No module-level ``__getattr__``: a name that exists only at run time is invisible to import-linter and to
    readers (the pre-release shims that used one were removed, CHANGELOG "Removed")."""
    import importlib
    import pkgutil

    lazy = [
        info.name
        for info in pkgutil.walk_packages(lightning_xai.__path__, "lightning_xai.")
        if "__getattr__" in vars(importlib.import_module(info.name))
    ]
    assert lazy == []

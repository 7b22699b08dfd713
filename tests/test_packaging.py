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

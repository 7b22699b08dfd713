"""Reuse the callback tests' SST-2 slices and tiny models (the ``kit`` fixture)."""
from __future__ import annotations

import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "_lightning_xai_callback_kit", pathlib.Path(__file__).resolve().parent.parent / "callbacks" / "conftest.py")
_kit_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_kit_module)

kit = _kit_module.kit

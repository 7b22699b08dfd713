"""MkDocs hook: the API reference and the results gallery are generated at build time, so they cannot drift.

* **API reference**: one page per public name of each subpackage (its ``__all__``), rendered by mkdocstrings from
  the docstrings; a public class or function without a page cannot exist.
* **Results gallery**: the measured results (``examples/RESULTS_*.md``, ``benchmarks/README.md``) become pages as
  they are in the repository; the files they link to (figures, JSON) are copied beside them, and a link to a file
  that does not exist is left as it is, so ``mkdocs build --strict`` fails on it.

The navigation is the hand-written ``nav`` of ``mkdocs.yml`` with the generated sections appended.
"""

from __future__ import annotations

import importlib
import inspect
import posixpath
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

#: (section title, subpackage) of the API reference, in reading order
API_SECTIONS: List[Tuple[str, str]] = [
    ("Callbacks", "lightning_xai.callbacks"),
    ("Losses", "lightning_xai.losses"),
    ("Metrics", "lightning_xai.metrics"),
    ("Functional metrics", "lightning_xai.metrics.functional"),
    ("Attribution", "lightning_xai.attribution"),
    ("Adapters", "lightning_xai.adapters"),
    ("Audits", "lightning_xai.audits"),
    ("Models", "lightning_xai.models"),
    ("Data", "lightning_xai.data"),
    ("Reporting", "lightning_xai.reporting"),
]

#: (page title, repository file) of the results gallery
RESULTS: List[Tuple[str, str]] = [
    ("Jain & Wallace on SST-2", "examples/RESULTS_jain_wallace.md"),
    ("Transformers and context mixing", "examples/RESULTS_transformers.md"),
    ("MiniLM and Hugging Face", "examples/RESULTS_hf.md"),
    ("Losses of the debate", "examples/RESULTS_losses.md"),
    ("Supervised attention", "examples/RESULTS_supervised_attention.md"),
    ("Plausibility (ERASER)", "examples/RESULTS_plausibility.md"),
    ("Remove and retrain", "examples/RESULTS_roar.md"),
    ("Token interactions", "examples/RESULTS_interactions.md"),
    ("Generation and word alignments", "examples/RESULTS_generation.md"),
    ("Benchmarks", "benchmarks/README.md"),
]

_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def _public(module_name: str) -> List[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        raise RuntimeError(f"{module_name} has no __all__: the API reference lists a subpackage's __all__")
    return sorted(names, key=lambda n: (not inspect.isclass(getattr(module, n, None)), n.lower()))


def _api_pages(config: Any) -> Tuple[List[File], List[Dict[str, Any]]]:
    files, nav = [], []
    for title, module_name in API_SECTIONS:
        slug = module_name.replace("lightning_xai.", "").replace(".", "/")
        entries: List[Dict[str, str]] = []
        for name in _public(module_name):
            uri = f"api/{slug}/{name}.md"
            files.append(File.generated(config, uri, content=f"# `{name}`\n\n::: {module_name}.{name}\n"))
            entries.append({name: uri})
        nav.append({title: entries})
    return files, [{"API reference": nav}]


def _rewrite(text: str, source: str, pages: Dict[str, str], page_uri: str, copies: Dict[str, str]) -> str:
    """Relative links of ``source`` (a repository path) pointed at the generated site."""
    here = posixpath.dirname(source)

    def fix(match: "re.Match[str]") -> str:
        target = match.group(2)
        if "://" in target or target.startswith(("mailto:", "/")):
            return match.group(0)
        repo_path = posixpath.normpath(posixpath.join(here, target))
        if repo_path in pages:
            new = pages[repo_path]
        elif (ROOT / repo_path).is_file():
            new = copies.setdefault(repo_path, f"results/files/{repo_path}")
        else:
            return match.group(0)  # a broken link stays broken, and the strict build says so
        rel = posixpath.relpath(new, posixpath.dirname(page_uri))
        return f"{match.group(1)}{rel}{match.group(3) or ''}{match.group(4)}"

    return _LINK.sub(fix, text)


def _result_pages(config: Any) -> Tuple[List[File], List[Dict[str, Any]]]:
    present = [(title, path) for title, path in RESULTS if (ROOT / path).is_file()]
    pages = {
        path: f"results/{Path(path).parent.name}-{Path(path).stem}.md".replace("examples-RESULTS_", "").lower()
        for _, path in present
    }
    files, copies = [], {}
    nav: List[Dict[str, str]] = [{"Overview": "results/index.md"}]
    for title, path in present:
        text = _rewrite((ROOT / path).read_text(encoding="utf-8"), path, pages, pages[path], copies)
        files.append(File.generated(config, pages[path], content=text))
        nav.append({title: pages[path]})
    for repo_path, uri in copies.items():
        files.append(File.generated(config, uri, content=(ROOT / repo_path).read_bytes()))
    return files, [{"Results": nav}]


_GENERATED: List[Tuple[List[File], List[Dict[str, Any]]]] = []


def on_config(config: Any) -> Any:
    _GENERATED[:] = [_api_pages(config), _result_pages(config)]
    for _, nav in _GENERATED:
        config["nav"].extend(nav)
    return config


def on_files(files: Files, config: Any) -> Files:
    for generated, _ in _GENERATED:
        for file in generated:
            files.append(file)
    return files

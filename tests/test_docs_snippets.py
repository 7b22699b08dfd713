"""The README's and the docs site's Python snippets compile and import only names that exist, so the pages cannot
drift from the API they describe (the API reference itself is generated from the docstrings)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _snippets():
    for page in PAGES:
        for number, block in enumerate(_BLOCK.findall(page.read_text(encoding="utf-8"))):
            yield pytest.param(block, id=f"{page.relative_to(ROOT)}#{number}")


@pytest.mark.parametrize("code", list(_snippets()))
def test_snippet_compiles_and_its_imports_exist(code):
    tree = ast.parse(code)  # a SyntaxError fails the test
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in imports:
        exec(compile(ast.Module(body=[node], type_ignores=[]), "<snippet>", "exec"), {})


def test_every_page_has_at_least_one_checked_snippet_somewhere():
    assert len(list(_snippets())) >= 5  # the check itself can fail: it needs snippets to read

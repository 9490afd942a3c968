"""The tree's shape: no module reaches into another module's private names.

A name with a leading underscore is its module's own; importing it from elsewhere (as smoke's
checks once imported `_guard`, `_json`, `_post_json` from smoke/api.py) makes a private helper a
hidden API that a refactor of its module breaks. Checked with `ast` over every Python file of the
kit and its tests."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

TREES = ("launch", "smoke", "kvgeometry", "docker", "patches", "tests")
"""The kit's packages: a private name of one of their modules stays in that module. (vLLM's own
private planner helpers that tests/planner calls to reproduce vLLM's arithmetic exactly are
vLLM's, not the kit's, and the standard library's argparse._SubParsersAction has no public
name.)"""


def _kit(module: str) -> bool:
    return module.split(".")[0] in TREES


def private_imports(path: Path) -> list[str]:
    """`from X import _name` and `X._name` attribute reads of an imported kit module X."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    modules = {alias.asname or alias.name for node in ast.walk(tree)
               if isinstance(node, ast.Import) for alias in node.names if _kit(alias.name)}
    modules |= {alias.asname or alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and _kit(node.module)
                for alias in node.names}  # fmt: skip
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _kit(
            node.module
        ):
            found += [f"{path.relative_to(REPO)}:{node.lineno}: from {node.module} import "
                      f"{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in modules and node.attr.startswith("_")
              and not node.attr.startswith("__")):  # fmt: skip
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    files = [p for tree in TREES for p in sorted((REPO / tree).rglob("*.py"))
             if "__pycache__" not in p.parts and "hf-configs" not in p.parts]  # fmt: skip
    assert len(files) > 100
    found = [hit for path in files for hit in private_imports(path)]
    assert found == []


def test_the_checker_finds_both_forms():
    """What the rule refuses, written both ways it can be written."""
    sample = REPO / "tests" / "_private_import_sample.py"
    sample.write_text("import os\nfrom smoke import api\nfrom smoke.api import _guard\n"
                      "api._json\nos._exit\n", encoding="utf-8")  # fmt: skip
    try:
        assert private_imports(sample) == [
            "tests/_private_import_sample.py:3: from smoke.api import _guard",
            "tests/_private_import_sample.py:4: api._json",
        ]
    finally:
        sample.unlink()


README_LINES = 160
"""The quick start's reader reads README.md whole; more detail goes to docs/."""


def test_the_readme_fits_its_reader():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"

"""The tree's shape: packages import downward only, no import circle, no module reaches into
another module's private names, and the README fits its reader.

A name with a leading underscore is its module's own; importing it from elsewhere (as smoke's
checks once imported `_guard`, `_json`, `_post_json` from smoke/api.py) makes a private helper a
hidden API that a refactor of its module breaks. Checked with `ast` over every Python file of the
kit and its tests (imports inside functions and TYPE_CHECKING blocks count: a circle closed
through one is still a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

TREES = ("launch", "smoke", "serving", "kvgeometry", "capacity", "docker", "patches", "tests")
"""The kit's packages: a private name of one of their modules stays in that module. (vLLM's own
private planner helpers that tests/planner calls to reproduce vLLM's arithmetic exactly are
vLLM's, not the kit's, and the standard library's argparse._SubParsersAction has no public
name.)"""


def _kit(module: str) -> bool:
    return module.split(".")[0] in TREES


def private_imports(source: str, name: str) -> list[str]:
    """`from X import _name` and `X._name` attribute reads of an imported kit module X in
    `source` (the file `name`)."""
    tree = ast.parse(source, name)
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
            found += [f"{name}:{node.lineno}: from {node.module} import "
                      f"{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id in modules and node.attr.startswith("_")
              and not node.attr.startswith("__")):  # fmt: skip
            found.append(f"{name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def kit_files(trees: tuple[str, ...] = TREES) -> list[Path]:
    return [p for tree in trees for p in sorted((REPO / tree).rglob("*.py"))
            if "__pycache__" not in p.parts and "hf-configs" not in p.parts]  # fmt: skip


def test_no_module_imports_another_modules_private_names():
    files = kit_files()
    assert len(files) > 100
    found = [hit for path in files for hit in
             private_imports(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))]
    assert found == []


def test_the_checker_finds_both_forms():
    """What the rule refuses, written both ways it can be written."""
    sample = "import os\nfrom smoke import api\nfrom smoke.api import _guard\napi._json\nos._exit\n"
    assert private_imports(sample, "sample.py") == [
        "sample.py:3: from smoke.api import _guard",
        "sample.py:4: api._json",
    ]


SOURCE = ("launch", "smoke", "serving", "kvgeometry", "capacity", "docker", "patches")
"""The kit's source packages (tests may import anything)."""
COMMANDS = "commands"
LAYERS: dict[str, frozenset[str]] = {
    "patches": frozenset(),
    "kvgeometry": frozenset(),
    "launch": frozenset({"kvgeometry"}),
    "capacity": frozenset({"launch", "kvgeometry"}),
    "smoke": frozenset({"launch", "kvgeometry", "capacity"}),
    "serving": frozenset({"launch", "kvgeometry", "capacity", "smoke"}),
    "docker": frozenset({"launch", "smoke"}),
    COMMANDS: frozenset({"launch", "kvgeometry", "capacity", "smoke", "serving"}),
}
"""Which layer may import which. The plugin (`kvgeometry`) and the patch applier run inside
vLLM's processes and import only vLLM; the launcher's core knows the plugin's names; capacity
asks the image with the launcher's plan; smoke checks a start the launcher made; the serving
tools (bench, soak, top, dashboard) load and watch it through smoke's client; the build tools
(`docker/`) use the launcher and smoke's prompts. The commands (`launch.commands`, the
`commands/` of smoke and serving, `__main__`) sit on top: nothing below imports a command."""


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    return name.removesuffix(".__init__")


def layer(module: str) -> str:
    leaf = module.rsplit(".", 1)[-1]
    if ".commands" in module or leaf == "__main__" or leaf.endswith("_cmd"):
        return COMMANDS
    return module.split(".")[0]


def imported_modules(source: str, known: set[str]) -> set[str]:
    """The kit modules `source` imports, anywhere in it (`from P import m` names module P.m
    when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m in known}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in kit_files(SOURCE)}
    known = set(paths)
    return {name: imported_modules(path.read_text(encoding="utf-8"), known) - {name}
            for name, path in paths.items()}  # fmt: skip


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({layer(m)}) imports {d} ({layer(d)})" for m, deps in graph.items()
                  for d in deps if layer(d) != layer(m) and layer(d) not in LAYERS[layer(m)])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_packages_import_downward_only():
    graph = import_graph()
    assert {layer(m) for m in graph} == set(LAYERS)
    assert layer_violations(graph) == []


def test_no_import_circle_among_the_kits_modules():
    assert circles(import_graph()) == []


def test_the_layering_and_circle_checks_find_what_they_refuse():
    """The arrow kvgeometry -> launch that the capacity code once drew, and launch's old
    loader -> validate -> render -> plan -> loader circle (closed by a TYPE_CHECKING import)."""
    upward = {"kvgeometry.capacity": {"launch.vllm_argv"}, "launch.vllm_argv": set()}
    assert layer_violations(upward) == [
        "kvgeometry.capacity (kvgeometry) imports launch.vllm_argv (launch)"]
    known = {"launch.loader", "launch.validate", "launch.render", "launch.plan"}
    render = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from launch.plan import Plan\n")
    graph = {"launch.loader": imported_modules("from launch.validate import validate", known),
             "launch.validate": imported_modules("from launch import render", known),
             "launch.render": imported_modules(render, known),
             "launch.plan": imported_modules("from launch.loader import load", known)}
    assert circles(graph) == [sorted(known)]


README_LINES = 160
"""The quick start's reader reads README.md whole; more detail goes to docs/."""


def test_the_readme_fits_its_reader():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


HTTP_LIBRARIES = frozenset({"requests", "httptools", "aiohttp", "urllib3", "http.client",
                            "urllib.request", "h11"})  # fmt: skip
"""HTTP client libraries other than the kit's one (httpx)."""
OTHER_HTTP = {"launch.docker_api": {"requests"}, "docker.engine.build_inputs": {"urllib.request"}}
"""The two that are not the kit's client: the Docker SDK speaks HTTP to the engine through
requests and raises its errors, which the engine's error handling has to name; the image
build's CA fetch runs before any package is installed, with the standard library alone."""


def http_libraries(source: str) -> set[str]:
    """The HTTP client libraries other than httpx that `source` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        found |= {n for n in names for lib in HTTP_LIBRARIES
                  if n == lib or n.startswith(lib + ".")}  # fmt: skip
    return found


def test_the_kit_speaks_http_through_one_client_library():
    """Every HTTP request the kit's code makes (checks, timed streams, registries, the Hub) goes
    through httpx, but for `OTHER_HTTP`."""
    used = {module_name(p): libs for p in kit_files(SOURCE)
            if (libs := http_libraries(p.read_text(encoding="utf-8")))}
    assert used == OTHER_HTTP
    assert http_libraries("import requests\nfrom httptools import parser\n") == {
        "requests", "httptools"}

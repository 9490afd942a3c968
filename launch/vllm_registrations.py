"""What a vLLM source tree registers, read from the registration sites themselves.

A knob counts only when vLLM declares it where vLLM looks names up: a key of `environment_variables`
in envs.py (the table `vllm.envs.__getattr__` answers from), a member of `AttentionBackendEnum`, a
key of the lazy parser tables, a value of a `Literal` alias that argparse turns into choices, a
string key read from an `additional_config` mapping. A comment, a docstring or a longer name that
contains the knob's name does not count (`B12X_PCIE_ALLREDUCE_ALGORITHM` is not
`B12X_PCIE_ALLREDUCE`).

The sites are parsed with `ast`, not imported: importing vllm.envs imports torch
(vllm.env_override), seconds per start. The tests compare every reader here with the imported
objects of the installed vLLM, so both readings agree.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

_CHOICE_HELPERS = frozenset({"env_with_choices", "env_list_with_choices", "env_set_with_choices"})
ENV_TABLE = "environment_variables"


def _strings(node: ast.AST | None) -> tuple[str, ...] | None:
    """The strings of a literal list/tuple/set of strings, else None (computed choices)."""
    if not isinstance(node, ast.List | ast.Tuple | ast.Set):
        return None
    values = [e.value for e in node.elts
              if isinstance(e, ast.Constant) and isinstance(e.value, str)]  # fmt: skip
    return tuple(values) if len(values) == len(node.elts) else None


def _choices(value: ast.AST) -> tuple[str, ...] | None:
    """Choices of `env_with_choices("NAME", default, [..])` (also by keyword), else None."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return None
    if value.func.id not in _CHOICE_HELPERS:
        return None
    given = value.args[2] if len(value.args) > 2 else None
    for keyword in value.keywords:
        if keyword.arg == "choices":
            given = keyword.value
    return _strings(given)


def _dict_items(node: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values, strict=True):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                yield key.value, value


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment statement assigns to (`a = b = v`, `a: T = v`); [] for anything else."""
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def env_table(source: str) -> dict[str, tuple[str, ...] | None]:
    """envs.py's `environment_variables`: each registered name with its declared choices (None when
    the variable takes any value or its choices are computed). Reads the table's literal and every
    later `environment_variables["X"] = ...` and `environment_variables.update({...})`."""
    table: dict[str, tuple[str, ...] | None] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            for target in _targets(node):
                if _is_name(target, ENV_TABLE) and node.value is not None:
                    table.update((k, _choices(v)) for k, v in _dict_items(node.value))
                if (
                    isinstance(target, ast.Subscript)
                    and _is_name(target.value, ENV_TABLE)
                    and isinstance(target.slice, ast.Constant)
                    and isinstance(target.slice.value, str)
                    and node.value is not None
                ):
                    table[target.slice.value] = _choices(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and _is_name(node.func.value, ENV_TABLE)
            and node.args
        ):
            table.update((k, _choices(v)) for k, v in _dict_items(node.args[0]))
    return table


def enum_members(source: str, class_name: str) -> frozenset[str]:
    """Member names of `class <class_name>(...Enum...)`: its class-level assignments in capitals."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            names = set()
            for statement in node.body:
                names.update(t.id for t in _targets(statement)
                             if isinstance(t, ast.Name) and t.id.isupper())  # fmt: skip
            return frozenset(names)
    return frozenset()


def table_keys(source: str, table: str) -> frozenset[str]:
    """Keys of a module-level dict literal `<table> = {"name": ..., ...}` (vLLM's lazy parser
    registries: `_REASONING_PARSERS_TO_REGISTER`, `_TOOL_PARSERS_TO_REGISTER`)."""
    keys: set[str] = set()
    for node in ast.parse(source).body:
        if any(_is_name(t, table) for t in _targets(node)) and node.value is not None:
            keys.update(k for k, _ in _dict_items(node.value))
    return frozenset(keys)


def literal_alias(source: str, alias: str) -> frozenset[str]:
    """The values of `<alias> = Literal["a", "b"]` (vLLM's config enums, which EngineArgs turns
    into argparse choices: `KVOffloadingBackend` -> `--kv-offloading-backend {native,lmcache}`)."""
    for node in ast.parse(source).body:
        if not any(_is_name(t, alias) for t in _targets(node)):
            continue
        value = node.value  # type: ignore[attr-defined]
        if not isinstance(value, ast.Subscript):
            continue
        inner = value.slice
        elts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return frozenset(
            e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        )
    return frozenset()


def _ends_in(node: ast.AST, name: str) -> bool:
    return _is_name(node, name) or (isinstance(node, ast.Attribute) and node.attr == name)


def mapping_keys_read(source: str, mapping: str = "additional_config") -> frozenset[str]:
    """String keys the code reads from a mapping named `mapping` (a variable or an attribute):
    `m.get("k", ...)`, `m["k"]` (not as an assignment target) and `"k" in m`."""
    keys: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _ends_in(node.func.value, mapping)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.add(node.args[0].value)
        elif (
            isinstance(node, ast.Subscript)
            and _ends_in(node.value, mapping)
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
            and isinstance(node.ctx, ast.Load)
        ):
            keys.add(node.slice.value)
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.left.value, str)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In)
            and _ends_in(node.comparators[0], mapping)
        ):
            keys.add(node.left.value)
    return frozenset(keys)


def environ_reads(source: str) -> frozenset[str]:
    """Names the code reads straight from the process environment, without envs.py:
    `os.getenv("N")` (or a bare `getenv`), `os.environ.get("N")`, `os.environ["N"]` and
    `"N" in os.environ`. vLLM honours such a name as much as a registered one, but its start-up
    check (`Platform.validate_environ`) warns "Unknown vLLM environment variable detected" for
    every `VLLM_*` name envs.py does not register."""
    names = set(mapping_keys_read(source, "environ"))
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and _ends_in(node.func, "getenv")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return frozenset(names)


_METRIC = re.compile(r"^vllm:[a-z0-9_]+$")


def metric_names(source: str) -> frozenset[str]:
    """The Prometheus metric names a module defines: string constants that are a whole metric
    name (`name="vllm:num_requests_running"`, the `("vllm:spec_decode_num_drafts", help)` table,
    `name = "vllm:cache_config_info"`). Such a string has no other use in vLLM, and a docstring or
    help text that mentions one is longer than the name."""
    return frozenset(
        node.value for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and _METRIC.match(node.value)
    )  # fmt: skip

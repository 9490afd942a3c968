"""Strict conversion between plain data (YAML, override text) and the typed profile model.

Types come from the dataclass annotations, so the model in `launch.profile` is the only schema;
pydantic validates against it. An unknown key, a wrong type or a missing field is a
`UsageError` naming the dotted path.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from pydantic import TypeAdapter, ValidationError

from launch.errors import UsageError

T = TypeVar("T")

_NONE_WORDS = frozenset({"none", "null", ""})
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


INT_BOUND = 2**63 - 1
"""No integer setting of vLLM holds more (its configs end in int64 tensors and C code)."""


def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _optional_inner(hint: Any) -> Any | None:
    """Return X for `X | None`, else None."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(get_args(hint)) == 2:
            return args[0]
    return None


def _type_name(hint: Any) -> str:
    inner = _optional_inner(hint)
    if inner is not None:
        return f"{_type_name(inner)} or none"
    if dataclasses.is_dataclass(hint):
        return "a mapping"
    origin = get_origin(hint)
    if origin is tuple:
        return f"a list of {_type_name(get_args(hint)[0])}"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        hint, str(hint)
    )


def build(cls: type[T], data: Any, path: str) -> T:
    """Build dataclass `cls` from plain data with pydantic's strict JSON-mode validation (a YAML
    list makes a tuple and an integer a float; a string is no number and true is no integer),
    every model dataclass refusing keys it does not have (`STRICT`). The first problem becomes
    one UsageError naming its dotted path, the rule and the fix."""
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):
        bad, where = _not_json(data, path)
        if isinstance(bad, float):
            raise UsageError(where, bad, "is not a finite number",
                             "give a number such as 32 or 0.5") from None  # fmt: skip
        raise UsageError(where, bad, "is not plain YAML data (a number, string, true/false, "
                         "list or mapping)", "quote it as a string") from None  # fmt: skip
    try:
        return TypeAdapter(cls).validate_json(text, strict=True)
    except ValidationError as exc:
        errors = exc.errors()
        # an unknown key first: a misspelt key also makes the real one missing
        first = next((e for e in errors if e["type"] == "unexpected_keyword_argument"), errors[0])
        raise _problem(cls, path, first) from None


def _not_json(data: Any, path: str) -> tuple[Any, str]:
    """The first value below `data` that JSON cannot hold, and its path."""
    if isinstance(data, Mapping):
        for key, value in data.items():
            found = _not_json(value, f"{path}.{key}" if path else str(key))
            if found[1]:
                return found
        return None, ""
    if isinstance(data, list | tuple):
        for i, value in enumerate(data):
            found = _not_json(value, f"{path}[{i}]")
            if found[1]:
                return found
        return None, ""
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):
        return data, path or "(profile)"
    return None, ""


def _problem(cls: type, path: str, error: Any) -> UsageError:
    loc = error["loc"]
    where = path
    for part in loc:
        if isinstance(part, int):
            where = f"{where}[{part}]"
        else:
            where = f"{where}.{part}" if where else str(part)
    hint = _hint_along(cls, loc)
    value = error.get("input")
    kind = error["type"]
    if kind == "missing":
        return UsageError(where, None, "is required", f"add '{loc[-1]}:' to the profile")
    if kind == "unexpected_keyword_argument":
        known = [f.name for f in dataclasses.fields(_hint_along(cls, loc[:-1]))]
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        fix = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
        return UsageError(where, value, "unknown key (a typo would otherwise be ignored)", fix)
    if kind in ("dataclass_type", "dataclass_exact_type"):
        return UsageError(where, value, "must be a mapping of keys to values",
                          "write it as key: value lines")  # fmt: skip
    if kind == "dict_type":
        return UsageError(where, value, "must be a mapping", "write it as key: value lines")
    if kind in ("tuple_type", "list_type"):
        return UsageError(where, value, f"must be {_type_name(hint)}",
                          "write it as a list, e.g. [0, 1]")  # fmt: skip
    return UsageError(where, value, f"must be {_type_name(hint)}", f"give {_type_name(hint)}")


def _hint_along(cls: type, loc: tuple[str | int, ...]) -> Any:
    """The annotated type at a pydantic error location below dataclass `cls`."""
    hint: Any = cls
    for part in loc:
        inner = _optional_inner(hint)
        hint = inner if inner is not None else hint
        if dataclasses.is_dataclass(hint):
            hint = _hints(hint).get(str(part))  # type: ignore[arg-type]
        elif get_origin(hint) in (tuple, dict):
            hint = get_args(hint)[-1] if get_origin(hint) is dict else get_args(hint)[0]
        else:
            return hint
    inner = _optional_inner(hint)
    return inner if inner is not None else hint


def parse_text(hint: Any, text: str, path: str) -> Any:
    """Parse override text (an environment variable or `--set` value) into plain data."""
    inner = _optional_inner(hint)
    if inner is not None:
        if text.strip().lower() in _NONE_WORDS:
            return None
        return parse_text(inner, text, path)
    stripped = text.strip()
    origin = get_origin(hint)
    try:
        if hint is bool:
            word = stripped.lower()
            if word in _TRUE_WORDS:
                return True
            if word in _FALSE_WORDS:
                return False
            raise ValueError(text)
        if hint is int:
            digits = stripped.replace("_", "")
            if not (digits.lstrip("-").isascii() and digits.lstrip("-").isdigit()):
                raise ValueError(text)
            value = int(digits)
            if abs(value) > INT_BOUND:
                raise UsageError(path, text, f"is beyond {INT_BOUND:,} (2^63 - 1, the largest "
                                 "integer vLLM's configuration holds)", "give a realistic value")
            return value
        if hint is float:
            number = float(stripped)
            if not math.isfinite(number):
                raise UsageError(path, text, "is not a finite number",
                                 "give a number such as 32 or 0.5")
            return number
        if hint is str:
            return stripped
        if origin is tuple:
            parts = [p for p in stripped.replace(" ", ",").split(",") if p]
            return [parse_text(get_args(hint)[0], p, path) for p in parts]
        if origin is dict or dataclasses.is_dataclass(hint):
            return json.loads(stripped)
    except (ValueError, json.JSONDecodeError):
        pass
    raise UsageError(path, text, f"must be {_type_name(hint)}", f"give {_type_name(hint)}")


def hint_at(cls: type, dotted: str) -> Any:
    """The annotated type at a dotted path below dataclass `cls` (KeyError if there is none)."""
    hint: Any = cls
    for part in dotted.split("."):
        inner = _optional_inner(hint)
        hint = inner if inner is not None else hint
        if not dataclasses.is_dataclass(hint):
            raise KeyError(dotted)
        hints = _hints(hint)  # type: ignore[arg-type]
        if part not in hints:
            raise KeyError(dotted)
        hint = hints[part]
    return hint


def field_paths(cls: type, prefix: str = "") -> list[str]:
    """Every settable dotted path below dataclass `cls` (nested dataclasses expanded)."""
    out: list[str] = []
    for name, hint in _hints(cls).items():
        path = f"{prefix}{name}"
        inner = _optional_inner(hint)
        target = inner if inner is not None else hint
        if dataclasses.is_dataclass(target):
            out.extend(field_paths(target, f"{path}."))  # type: ignore[arg-type]
        out.append(path)
    return out


def to_plain(obj: Any) -> Any:
    """Typed model -> plain JSON-ready data, dropping unset (None) fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if getattr(obj, f.name) is not None
        }
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj

"""Strict conversion between plain data (YAML, override text) and the typed profile model.

Types come from the dataclass annotations, so the model in `launch.profile` is the only schema:
an unknown key, a wrong type or a missing field is a `ProfileError` naming the dotted path.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
from collections.abc import Mapping
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from launch.errors import ProfileError

T = TypeVar("T")

_NONE_WORDS = frozenset({"none", "null", ""})
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


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
    """Build dataclass `cls` from plain data, rejecting unknown keys and wrong types."""
    if not isinstance(data, Mapping):
        raise ProfileError(
            path, data, "must be a mapping of keys to values", "write it as key: value lines"
        )
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(fields)}"
            raise ProfileError(
                f"{path}.{key}" if path else str(key),
                data[key],
                "unknown key (a typo would otherwise be ignored)",
                hint,
            )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        sub = f"{path}.{name}" if path else name
        if name in data:
            kwargs[name] = convert(hints[name], data[name], sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProfileError(sub, None, "is required", f"add '{name}:' to the profile")
    return cls(**kwargs)


def convert(hint: Any, value: Any, path: str) -> Any:
    """Convert one plain value to the annotated type."""
    inner = _optional_inner(hint)
    if inner is not None:
        return None if value is None else convert(inner, value, path)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, path)  # type: ignore[arg-type]
    origin = get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ProfileError(
                path, value, f"must be {_type_name(hint)}", "write it as a list, e.g. [0, 1]"
            )
        item = get_args(hint)[0]
        return tuple(convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ProfileError(path, value, "must be a mapping", "write it as key: value lines")
        _, val_hint = get_args(hint)
        return {str(k): convert(val_hint, v, f"{path}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    is_bool = isinstance(value, bool)
    if (
        (hint is bool and is_bool)
        or (hint is int and isinstance(value, int) and not is_bool)
        or (hint is str and isinstance(value, str))
    ):
        return value
    if hint is float and isinstance(value, int | float) and not is_bool:
        return float(value)
    raise ProfileError(path, value, f"must be {_type_name(hint)}", f"give {_type_name(hint)}")


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
            return int(stripped.replace("_", ""))
        if hint is float:
            return float(stripped)
        if hint is str:
            return stripped
        if origin is tuple:
            parts = [p for p in stripped.replace(" ", ",").split(",") if p]
            return [parse_text(get_args(hint)[0], p, path) for p in parts]
        if origin is dict or dataclasses.is_dataclass(hint):
            return json.loads(stripped)
    except (ValueError, json.JSONDecodeError):
        pass
    raise ProfileError(path, text, f"must be {_type_name(hint)}", f"give {_type_name(hint)}")


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

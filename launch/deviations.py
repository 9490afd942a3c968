"""How a run differs from its qualified profile, as typed records (shown as one line each).

Three kinds: a setting an override changed, an expectation that is no longer checked (and why),
and a capability the installed vLLM lacks that a fallback drops. Expectation keys are the
`Expect` dataclass's own field names: a name that is not one is refused where it is written,
not silently filtered out later.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from launch.errors import SHOWN_CHARS
from launch.profile import Expect

EXPECT_KEYS = frozenset(f.name for f in fields(Expect) if f.name != "sources")
"""Every expectation a profile can state (the `expect` section's keys)."""


def expect_key(name: str) -> str:
    """`name` if it is an expectation of `Expect`; a ValueError naming the known ones if not."""
    if name not in EXPECT_KEYS:
        raise ValueError(f"{name!r} is not an expectation (Expect has {sorted(EXPECT_KEYS)})")
    return name


def show(value: Any) -> str:
    """A setting's value as the plan shows it (a long one cut, as errors cut it)."""
    if value is None:
        return "unset"
    text = ",".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"


@dataclass(frozen=True)
class Changed:
    """An override that changed a setting of the profile."""

    path: str
    old: Any
    new: Any
    origin: str

    def __str__(self) -> str:
        return f"{self.path}: {show(self.old)} -> {show(self.new)} (from {self.origin})"


@dataclass(frozen=True)
class NotChecked:
    """An expectation dropped because something it depends on changed."""

    key: str
    why: str

    def __post_init__(self) -> None:
        expect_key(self.key)

    def __str__(self) -> str:
        return f"expect.{self.key} not checked: {self.why}"


@dataclass(frozen=True)
class FellBack:
    """A capability the installed vLLM lacks, dropped by a fallback the user allowed."""

    field: str
    value: Any
    needs: str
    name: str
    fallback: str

    def __str__(self) -> str:
        return (f"UNQUALIFIED: {self.field}={self.value} dropped, {self.needs}; "
                f"fallback {self.name}: {self.fallback}")  # fmt: skip


Deviation = Changed | NotChecked | FellBack

"""The geometry line: one value (`KVGeometry`), written by the plugin and read back by the smoke,
with its formatter and its parser side by side so that they cannot drift apart.

    KV cache geometry: layout=X stride_bytes=S num_blocks=N tokens=T scheduler_block=K
    hash_block=H group=G/ROLE/KIND/block=B/cp=C/layers=L/page_bytes=P ...

(`kvgeometry.report` says what each field is.) A value this vLLM could not give is None here and
`unknown` in the line. Standard library only: the plugin runs inside any vLLM image.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import Any

PREFIX = "KV cache geometry:"
UNKNOWN = "unknown"
MISSING = PREFIX + " not reported: "
"""How the plugin's WARNING opens when it cannot see the plan; the reason follows."""


def plain_json(value: Any) -> Any:
    """asdict's output with tuples as lists: JSON's arrays (what json and jsonschema expect)."""
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in value]
    return value


def _shown(value: Any) -> str:
    return UNKNOWN if value is None else str(value)


RoleValue = int | list[int] | None
"""A per-role value of the geometry: one number when every group of the role agrees, else the
sorted distinct numbers; None when vLLM could not give it."""


@dataclass(frozen=True)
class GeometryGroup:
    """One KV cache group of the kit's geometry line (kvgeometry.report)."""

    group: int
    role: str
    kind: str
    block_size: int | None
    cp_size: int | None
    layers: int
    page_bytes: int | None


@dataclass(frozen=True)
class KVGeometry:
    """The geometry plugin's `KV cache geometry:` line, and what the checks read from it."""

    layout: str
    stride_bytes: int | None
    num_blocks: int | None
    tokens: int | None
    scheduler_block: int | None
    hash_block: int | None
    groups: tuple[GeometryGroup, ...]

    def _by_role(self, key: str) -> dict[str, RoleValue]:
        out: dict[str, RoleValue] = {}
        for role in sorted({g.role for g in self.groups}):
            values = sorted({getattr(g, key) for g in self.groups if g.role == role},
                            key=lambda v: (v is None, v or 0))  # fmt: skip
            out[role] = values[0] if len(values) == 1 else values
        return out

    @property
    def block_sizes(self) -> dict[str, RoleValue]:
        return self._by_role("block_size")

    @property
    def page_bytes(self) -> dict[str, RoleValue]:
        return self._by_role("page_bytes")

    @property
    def layers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.role] = out.get(g.role, 0) + g.layers
        return out

    @property
    def cp_sizes(self) -> tuple[int | None, ...]:
        """CP sizes of the attention groups in order, one per group (recurrent state is never
        CP-sharded): the "effective cache-group CP sizes" seed 000 read from its logs."""
        return tuple(
            {g.group: g.cp_size for g in self.groups if g.role != "recurrent"}.values()
        )

    def to_json(self) -> dict[str, Any]:
        return {**plain_json(asdict(self)), "block_sizes": self.block_sizes,
                "page_bytes": self.page_bytes, "layers": self.layers,
                "cp_sizes": list(self.cp_sizes)}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KVGeometry:
        """`to_json`'s output read back (its derived per-role keys are recomputed)."""
        names = {f.name for f in fields(GeometryGroup)}
        groups = tuple(GeometryGroup(**{k: v for k, v in g.items() if k in names})
                       for g in data["groups"])  # fmt: skip
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name != "groups"},
                   groups=groups)

    def line(self) -> str:
        """The line the plugin logs for this geometry."""
        head = " ".join(f"{key}={_shown(getattr(self, name))}" for name, key in _HEAD)
        groups = [
            f"group={g.group}/{g.role}/{g.kind}/block={_shown(g.block_size)}/"
            f"cp={_shown(g.cp_size)}/layers={g.layers}/page_bytes={_shown(g.page_bytes)}"
            for g in self.groups
        ]
        return " ".join([f"{PREFIX} {head}", *groups])


_HEAD = (("layout", "layout"), ("stride_bytes", "stride_bytes"), ("num_blocks", "num_blocks"),
         ("tokens", "tokens"), ("scheduler_block", "scheduler_block"),
         ("hash_block", "hash_block"))  # fmt: skip
"""KVGeometry field -> key in the line, in the line's order."""
_N = rf"(?:\d+|{UNKNOWN})"
LINE = re.compile(
    rf"{re.escape(PREFIX)} layout=(?P<layout>\w+) stride_bytes=(?P<stride_bytes>{_N}) "
    rf"num_blocks=(?P<num_blocks>{_N}) tokens=(?P<tokens>{_N}) "
    rf"scheduler_block=(?P<scheduler_block>{_N}) hash_block=(?P<hash_block>{_N})"
    rf"(?P<groups>(?: group=\S+)*)"
)
GROUP = re.compile(
    rf"group=(?P<group>\d+)/(?P<role>\w+)/(?P<kind>\w+)/block=(?P<block_size>{_N})"
    rf"/cp=(?P<cp_size>{_N})/layers=(?P<layers>\d+)/page_bytes=(?P<page_bytes>{_N})"
)
MISSING_LINE = re.compile(rf"{re.escape(MISSING)}(?P<why>.+)$")


def _num(text: str) -> int | None:
    return None if text == UNKNOWN else int(text)


def parse_line(text: str) -> KVGeometry | None:
    """The geometry in a log message, or None when it holds no geometry line."""
    match = LINE.search(text)
    if match is None:
        return None
    groups = tuple(
        GeometryGroup(**{f.name: g.group(f.name) if f.name in ("role", "kind")
                         else _num(g.group(f.name)) for f in fields(GeometryGroup)})
        for g in GROUP.finditer(match.group("groups"))
    )  # fmt: skip
    head = {name: _num(match.group(name)) for name, _ in _HEAD if name != "layout"}
    return KVGeometry(layout=match.group("layout"), groups=groups, **head)


def parse_missing(text: str) -> str | None:
    """Why the plugin could not report, from its WARNING, or None."""
    match = MISSING_LINE.search(text)
    return match.group("why") if match else None

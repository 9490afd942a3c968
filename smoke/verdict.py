"""The verdict: every check's row in a table (or JSON, each row with its key), and the exit
status (0 only when something ran and everything that ran passed)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from smoke.check import Check


def exit_status(checks: Sequence[Check]) -> int:
    ran = [c for c in checks if not c.skipped]
    return 0 if ran and all(c.ok for c in ran) else 1


def format_table(checks: Sequence[Check]) -> str:
    rows = [("check", "expected", "seen", "result")]
    rows += [(c.name, c.expected, _cut(c.seen), _result(c)) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]
    passed = sum(c.ok for c in checks)
    skips = sum(c.skipped for c in checks)
    lines.append(f"{passed} passed, {len(checks) - passed - skips} failed"
                 + (f", {skips} skipped" if skips else ""))  # fmt: skip
    return "\n".join(lines)


def _result(c: Check) -> str:
    return "skip" if c.skipped else "pass" if c.ok else "FAIL"


def to_json(checks: Sequence[Check], **extra: Any) -> str:
    return json.dumps(
        {"ok": exit_status(checks) == 0, "checks": [asdict(c) for c in checks], **extra}, indent=2
    )


def _cut(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."

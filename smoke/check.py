"""One check's result: its key (what `--only`/`--skip`, the JSON verdict, the e2e lane and the
tests match on), its title (what the table shows), what was expected, what was seen, pass or
fail. Keys and titles are written once, in the registries (`smoke.checks` for the request
checks, `smoke.log_checks` for the log's); a check is handed its `Label` and never names itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from smoke.client import CheckFailed, RequestError, Timeout


@dataclass(frozen=True)
class Label:
    key: str
    title: str


@dataclass(frozen=True)
class Check:
    key: str
    name: str
    expected: str
    seen: str
    ok: bool
    skipped: bool = False
    """Does not apply to this profile (`seen` says why): neither passed nor failed."""


def result(label: Label, expected: str, seen: str, ok: bool) -> Check:
    return Check(label.key, label.title, expected, seen, ok)


def skipped(label: Label, reason: str) -> Check:
    return Check(label.key, label.title, "-", f"skipped: {reason}", False, skipped=True)


def guard(label: Label, expected: str, body: Callable[[], str]) -> Check:
    """Run one request check; a wrong answer, a timeout or a transport failure becomes a failed
    check with what was seen, never a traceback."""
    try:
        return result(label, expected, body(), True)
    except CheckFailed as err:
        return result(label, expected, str(err), False)
    except Timeout:
        return result(label, expected, "timed out", False)
    except RequestError as err:
        return result(label, expected, f"request failed: {type(err).__name__}", False)

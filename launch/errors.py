"""The one error type a user sees for bad input: field, value, rule and fix, exit status 2."""

from __future__ import annotations

from typing import Any

USAGE_EXIT = 2


class UsageError(Exception):
    """Input that breaks a rule: a profile, an override, a command-line value, a settings or lock
    file, a recorded output, a receipt, an unreachable Docker engine.

    The message always names the field, the value, the rule and a fix, so a person can correct it
    without reading code. Every command catches it at its edge and exits 2; nothing has started.
    """

    def __init__(self, field: str, value: Any, rule: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.field}={_shown(self.value)}: {self.rule}. Fix: {self.fix}"


SHOWN_CHARS = 200
"""A value longer than this is cut in the message (a 10 kB override is not echoed whole)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"

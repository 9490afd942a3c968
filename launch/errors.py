"""The one error type a user sees for bad input: field, value, rule and fix, exit status 2."""

from __future__ import annotations

from typing import Any

USAGE_EXIT = 2


class ProfileError(Exception):
    """A profile, override or command-line value that breaks a rule.

    The message always names the field, the value, the rule and a fix, so a person can correct it
    without reading code.
    """

    def __init__(self, field: str, value: Any, rule: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.rule = rule
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.rule}. Fix: {self.fix}"

"""Command-line arguments shared by the launch, smoke and serving commands, the argparse types of
the numbers a user gives (a bad one exits 2 with argparse's message naming the option), and the
one dispatcher of `python -m launch|smoke|serving`."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Protocol

from launch.errors import USAGE_EXIT, UsageError


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """`--set KEY=VALUE`, shared by every command that loads a profile."""
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting by variable name (MAX_NUM_SEQS=16) or path "
        "(engine.max_num_seqs=16); repeatable",
    )


def add_api_key_argument(parser: argparse.ArgumentParser) -> None:
    """`--api-key`, shared by the commands that call the server (`Settings.client_api_key`)."""
    parser.add_argument("--api-key", help="bearer token (default $VLLM_API_KEY, else the "
                        "server's key file compose/secrets/vllm_api_key)")  # fmt: skip


MAX_COUNT = 1 << 20
"""The largest count or token number a command takes (1,048,576: the longest context any
profile serves); a mistyped digit more is refused, not run for days or built in memory."""
MAX_SECONDS = 86_400.0
"""The longest duration or timeout a command takes: a day."""


def positive_int(text: str) -> int:
    """An argparse type: a whole number from 1 to `MAX_COUNT`, in ASCII digits."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 20
            and 1 <= int(digits) <= MAX_COUNT):  # fmt: skip
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a whole number from 1 to {MAX_COUNT:,}")
    return int(digits)


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0, at most `MAX_SECONDS`."""
    try:
        value = float(text) if len(text) <= 40 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number above 0 and at most {MAX_SECONDS:,.0f} (seconds)")
    return value


DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """An argparse type: seconds from `90`, `90s`, `30m` or `2h`, above 0 and at most a day."""
    number, unit = text.strip(), "s"
    if number[-1:].lower() in DURATION_UNITS:
        number, unit = number[:-1], number[-1].lower()
    try:
        seconds = positive_float(number) * DURATION_UNITS[unit]
    except argparse.ArgumentTypeError:
        seconds = math.nan
    if not 0 < seconds <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a duration such as 90s, 30m or 2h, at most 24h")
    return seconds


class Subcommand(Protocol):
    """A module of a `commands/` folder: its name, its parser, its run."""

    NAME: str

    def add_parser(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser: ...

    def run(self, args: argparse.Namespace) -> int: ...


def dispatch(prog: str, description: str | None, commands: Sequence[Subcommand],
             argv: Sequence[str] | None) -> int:  # fmt: skip
    """`python -m <prog> <command>`: parse, run the command; a UsageError is one message on
    stderr and exit 2 (nothing started)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in commands:
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    handler = {m.NAME: m.run for m in commands}[args.command]
    try:
        return handler(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT

"""`python -m launch <command>`: bad input exits 2 with one message, and nothing starts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from launch.commands import (
    capacity_cmd,
    configure_cmd,
    demo_cmd,
    doctor_cmd,
    fetch_cmd,
    list_cmd,
    pin_cmd,
    render_cmd,
    run_cmd,
    up_cmd,
)
from launch.errors import USAGE_EXIT, UsageError

COMMANDS = (list_cmd, render_cmd, doctor_cmd, run_cmd, configure_cmd, fetch_cmd, up_cmd,
            pin_cmd, capacity_cmd, demo_cmd)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    handlers = {}
    for module in COMMANDS:
        module.add_parser(subparsers)
        handlers[module.NAME] = module.run
    args = parser.parse_args(argv)
    try:
        return handlers[args.command](args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT


if __name__ == "__main__":
    sys.exit(main())

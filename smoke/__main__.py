"""`python -m smoke {check,geometry,bench,compare,soak,top,dashboard}`: 0 pass, 1 a check
failed, 2 bad usage."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from launch.errors import USAGE_EXIT, UsageError
from smoke import (
    bench_cmd,
    check_cmd,
    compare_cmd,
    dashboard_cmd,
    geometry_cmd,
    soak_cmd,
    top_cmd,
)

COMMANDS = (check_cmd, geometry_cmd, bench_cmd, compare_cmd, soak_cmd, top_cmd, dashboard_cmd)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smoke", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(subparsers)
    args = parser.parse_args(argv)
    handler = {m.NAME: m.run for m in COMMANDS}[args.command]
    try:
        return handler(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT


if __name__ == "__main__":
    sys.exit(main())

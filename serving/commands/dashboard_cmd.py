"""`python -m serving dashboard`: write the Grafana dashboard the monitoring profile provisions
(compose/grafana/glm53.json) from the panels in serving/dashboard.py; `--check` only compares
(exit 1 when the file differs: run the command without it). `--output` writes elsewhere."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from serving.dashboard import DASHBOARD_FILE, dashboard_json

NAME = "dashboard"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="write the Grafana dashboard from the kit's panels")
    p.add_argument("--output", type=Path, default=DASHBOARD_FILE,
                   help=f"where to write it (default {DASHBOARD_FILE})")  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="compare only: exit 1 when the file is not what the panels render")
    return p


def write_or_check(output: Path, *, check: bool) -> int:
    text = dashboard_json()
    if check:
        current = output.read_text(encoding="utf-8") if output.is_file() else None
        if current != text:
            print(f"{output} differs from the panels in serving/dashboard.py; write it with "
                  "`python -m serving dashboard`", file=sys.stderr)  # fmt: skip
            return 1
        print(f"{output} is what the panels render")
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}")
    return 0


def run(args: argparse.Namespace) -> int:
    return write_or_check(args.output, check=args.check)

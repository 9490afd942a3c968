"""`python -m smoke geometry --log FILE`: the facts a vLLM log states, optionally vs a profile."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from launch.cli_args import add_set_argument
from launch.errors import UsageError
from launch.plan import plan_for
from launch.settings import read_settings
from smoke.log_checks import log_checks
from smoke.log_facts import LogFacts
from smoke.logparse import parse_lines
from smoke.verdict import exit_status, format_table, to_json

NAME = "geometry"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="parse a vLLM server log into facts")
    parser.add_argument("--log", required=True, help="log file, or - for standard input")
    parser.add_argument("--profile", help="also compare the facts with this profile's expect")
    add_set_argument(parser)
    parser.add_argument("--service", help="compose service to report from a multi-service log")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.log == "-":
        facts = parse_lines(sys.stdin, args.service)
    else:
        path = Path(args.log)
        if not path.is_file():
            raise UsageError("--log", args.log, "is not a readable file", "pass a log file path")
        with path.open(encoding="utf-8", errors="replace", newline="") as fh:
            facts = parse_lines(fh, args.service)
    if not args.profile:
        print(json.dumps(facts.to_json(), indent=2) if args.json else _summary(facts))
        return 0
    plan = plan_for(read_settings(args.sets), args.profile)
    checks = log_checks(plan.profile, facts)
    print(to_json(checks, facts=facts.to_json()) if args.json else format_table(checks))
    return exit_status(checks)


def _summary(facts: LogFacts) -> str:
    plain = {k: v for k, v in facts.to_json().items() if k != "services"}
    lines = [f"{k}: {json.dumps(v)}" for k, v in plain.items()]
    for name, sub in (facts.services or {}).items():
        lines.append(
            f"[service {name}] kv_cache_tokens={sub.kv_cache_tokens} "
            f"starts={sub.starts} startup_failed={sub.startup_failed}"
        )
    return "\n".join(lines)

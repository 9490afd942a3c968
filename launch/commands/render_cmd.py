"""`python -m launch render PROFILE`: the exact command and environment, without starting it."""

from __future__ import annotations

import argparse
import json

from launch.commands.common import add_profile_arguments, plan_from_args
from launch.render import format_plan

NAME = "render"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="print the vllm serve command a profile runs")
    add_profile_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def run(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    print(json.dumps(plan.to_json(), indent=2) if args.json else format_plan(plan))
    return 0

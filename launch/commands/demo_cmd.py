"""`python -m launch demo` (`make demo`): the CPU profile served and smoke-checked from a fresh
clone, left running (`launch.demo`)."""

from __future__ import annotations

import argparse
import shlex
import sys

from launch.cli_args import positive_float
from launch.demo import PROFILE, DemoOptions, StepFailed, demo
from launch.loader import load
from launch.settings import read_settings

NAME = "demo"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME, help=f"build what is missing, start {PROFILE} with compose, smoke it, leave it up")
    parser.add_argument("--build-args", default="",
                        help="arguments for docker/build.py, one string (e.g. --trust-host-ca)")
    parser.add_argument("--healthy-within", type=positive_float, default=600.0, metavar="SECONDS",
                        help="how long the server may take to turn healthy")  # fmt: skip
    return parser


def run(args: argparse.Namespace) -> int:
    options = DemoOptions(tuple(shlex.split(args.build_args)), args.healthy_within)
    model = load(PROFILE).profile.engine.served_model_name or PROFILE
    try:
        return demo(options, read_settings(()), model)
    except StepFailed as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1

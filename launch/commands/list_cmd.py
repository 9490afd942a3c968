"""`python -m launch list`: the shipped profiles and what each one is."""

from __future__ import annotations

import argparse

from launch.errors import USAGE_EXIT, UsageError
from launch.loader import PROFILE_DIR, load, profile_names

NAME = "list"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return subparsers.add_parser(NAME, help="list the qualified profiles")


def run(args: argparse.Namespace) -> int:
    """Every profile, each on its own line; a broken file is listed with its error, not fatal
    to the rest (exit 2 at the end)."""
    broken = 0
    for name in profile_names():
        try:
            profile = load(name).profile
        except UsageError as err:
            broken += 1
            print(f"{name:20} BROKEN {PROFILE_DIR / (name + '.yaml')}: {err}")
            continue
        print(f"{name:20} {profile.summary}")
    return USAGE_EXIT if broken else 0

"""`python -m launch list`: the shipped profiles and what each one is."""

from __future__ import annotations

import argparse

from launch.loader import load, profile_names

NAME = "list"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return subparsers.add_parser(NAME, help="list the qualified profiles")


def run(args: argparse.Namespace) -> int:
    for name in profile_names():
        profile = load(name).profile
        print(f"{name:20} {profile.summary}")
    return 0

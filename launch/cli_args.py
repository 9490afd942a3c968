"""Command-line arguments shared by the launch and smoke commands."""

from __future__ import annotations

import argparse


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

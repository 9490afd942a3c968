"""`python -m smoke {check,geometry}`: 0 pass, 1 a check failed, 2 bad usage."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launch.cli_args import dispatch
from smoke.commands import check_cmd, geometry_cmd

COMMANDS = (check_cmd, geometry_cmd)


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("python -m smoke", __doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())

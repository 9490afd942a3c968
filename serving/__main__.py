"""`python -m serving {bench,compare,soak,top,dashboard}`: the tools used while a server
serves. 0 done (a bench or soak within its bounds), 1 a bound failed, 2 bad usage."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launch.cli_args import dispatch
from serving.commands import bench_cmd, compare_cmd, dashboard_cmd, soak_cmd, top_cmd

COMMANDS = (bench_cmd, compare_cmd, soak_cmd, top_cmd, dashboard_cmd)


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("python -m serving", __doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())

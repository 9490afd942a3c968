"""`python -m launch <command>`: bad input exits 2 with one message, and nothing starts."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from launch.cli_args import dispatch
from launch.commands import (
    capacity_cmd,
    configure_cmd,
    demo_cmd,
    doctor_cmd,
    fetch_cmd,
    list_cmd,
    pin_cmd,
    render_cmd,
    run_cmd,
    up_cmd,
)

COMMANDS = (list_cmd, render_cmd, doctor_cmd, run_cmd, configure_cmd, fetch_cmd, up_cmd,
            pin_cmd, capacity_cmd, demo_cmd)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("python -m launch", __doc__, COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())

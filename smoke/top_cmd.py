"""`python -m smoke top` (`make top`): the started server, a line per `--interval` from two reads
of its /metrics (`smoke.top`) until Ctrl-C; `--once` prints one interval and exits, `--json` a
JSON object per line. Exit 0; 1 when /metrics cannot be read; 2 on bad usage."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable

import requests

from launch.cli_args import duration
from smoke.client import CheckFailed, Server, metrics_text
from smoke.served import add_served_arguments, served
from smoke.top import reading, view

NAME = "top"
DEFAULT_INTERVAL_S = 2.0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="the started server, a line per interval from /metrics")
    add_served_arguments(p)
    p.add_argument("--interval", type=duration, default=DEFAULT_INTERVAL_S,
                   help="seconds between the two reads of a line (default 2)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="one interval, then exit")
    p.add_argument("--json", action="store_true", help="a JSON object per line")
    return p


def watch(server: Server, interval_s: float, *, once: bool, as_json: bool,
          out: Callable[[str], None], sleep: Callable[[float], None] = time.sleep) -> int:
    """Read /metrics every `interval_s` and print what happened in between."""
    try:
        before = reading(metrics_text(server), time.monotonic())
        while True:
            sleep(interval_s)
            after = reading(metrics_text(server), time.monotonic())
            shown = view(before, after)
            now = dt.datetime.now().strftime("%H:%M:%S")
            out(json.dumps({"time": now, **shown.to_json()}) if as_json
                else f"{now}  {shown.line()}")  # fmt: skip
            if once:
                return 0
            before = after
    except (CheckFailed, requests.RequestException, ValueError) as err:
        print(f"error: {server.url('/metrics')}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def run(args: argparse.Namespace) -> int:
    server_of = served(args.profile, args.sets, args.url, args.api_key)
    server = Server(server_of.url, server_of.plan.profile.engine.model_id, server_of.api_key,
                    timeout=max(10.0, args.interval))  # fmt: skip
    return watch(server, args.interval, once=args.once, as_json=args.json,
                 out=lambda line: print(line, flush=True))

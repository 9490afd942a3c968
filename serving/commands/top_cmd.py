"""`python -m serving top` (`make top`): the started server, or every replica when compose/.env runs
the service scaled out, from two reads of each one's /metrics per `--interval` (`serving.top`)
until Ctrl-C. On a terminal, one screen redrawn each interval, a row per server; piped, a line
per server per interval; `--json` a JSON object per server per interval; `--once` one interval,
then exit. Exit 0; 1 when a server's /metrics cannot be read (at the start, or at all with
`--once`; later, its row says why and the view goes on); 2 on bad usage."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Mapping

from launch.cli_args import duration
from launch.compose_config import REPLICAS_FILE
from launch.compose_env import generated
from serving.served import add_served_arguments, replica_urls, served
from serving.top import Reading, View, reading, screen, view
from smoke.client import CheckFailed, RequestError, Server, metrics_text

NAME = "top"
DEFAULT_INTERVAL_S = 1.0
CLEAR = "\x1b[H\x1b[2J"
"""Cursor home, then erase the screen (ANSI): each redraw replaces the last."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="the started server(s), live from /metrics")
    add_served_arguments(p)
    p.add_argument("--interval", type=duration, default=DEFAULT_INTERVAL_S,
                   help="seconds between the two reads of a refresh (default 1)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="one interval, then exit")
    p.add_argument("--json", action="store_true", help="a JSON object per server and interval")
    return p


def _read(server: Server) -> Reading:
    return reading(metrics_text(server), time.monotonic())


def _unread(server: Server, err: Exception) -> int:
    print(f"error: {server.url('/metrics')}: {err}", file=sys.stderr)
    return 1


def _shown(before: Reading | str, after: Reading | str) -> View | str:
    """A row: what the server did between two readings, or why there is nothing to show (its
    read failed: the reason; the one before failed: it answers again)."""
    if isinstance(after, str):
        return after
    if isinstance(before, str):
        return "answering again"
    return view(before, after)


def watch(servers: Mapping[str, Server], interval_s: float, *, once: bool, as_json: bool,
          on_screen: bool, out: Callable[[str], None],
          sleep: Callable[[float], None] = time.sleep) -> int:  # fmt: skip
    """Read every server's /metrics each `interval_s` and show what each did in between."""
    errors = (CheckFailed, RequestError, ValueError)
    before: dict[str, Reading | str] = {}
    for name, server in servers.items():
        try:
            before[name] = _read(server)
        except errors as err:
            return _unread(server, err)
    try:
        while True:
            sleep(interval_s)
            now = dt.datetime.now().strftime("%H:%M:%S")
            shown: dict[str, View | str] = {}
            after: dict[str, Reading | str] = {}
            for name, server in servers.items():
                try:
                    after[name] = _read(server)
                except errors as err:
                    if once:
                        return _unread(server, err)
                    after[name] = f"no answer: {err}"
                shown[name] = _shown(before[name], after[name])
            if as_json:
                for name, v in shown.items():
                    body = v.to_json() if isinstance(v, View) else {"error": v}
                    out(json.dumps({"time": now, "server": name, **body}))
            elif on_screen:
                out(CLEAR + screen(list(shown.items()), now, interval_s))
            else:
                for name, v in shown.items():
                    label = f"{name}  " if len(servers) > 1 else ""
                    out(f"{now}  {label}{v.line() if isinstance(v, View) else v}")
            if once:
                return 0
            before = after
    except KeyboardInterrupt:
        return 0


def run(args: argparse.Namespace) -> int:
    server_of = served(args.profile, args.sets, args.url, args.api_key)
    urls = {} if args.url else replica_urls(generated(), REPLICAS_FILE)
    urls = urls or {server_of.url.rsplit("/", 1)[-1]: server_of.url}
    timeout = max(10.0, args.interval)
    servers = {name: Server(url, server_of.plan.profile.engine.model_id, server_of.api_key,
                            timeout=timeout) for name, url in urls.items()}  # fmt: skip
    return watch(servers, args.interval, once=args.once, as_json=args.json,
                 on_screen=sys.stdout.isatty() and not args.once,
                 out=lambda text: print(text, end="" if text.startswith(CLEAR) else "\n",
                                        flush=True))  # fmt: skip

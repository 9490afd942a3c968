"""`python -m smoke check`: readiness, chat completions, and the log's geometry vs the profile.

The log is the compose service's own, read through the Docker Engine API (`smoke.containers`),
unless `--log FILE` or `--log -` gives one from elsewhere. Exit 0 when every check passes, 1 when
a check failed, 2 for bad usage, unreadable input or no Docker engine to read from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlsplit

from capacity.host import predict_start
from launch.cli_args import add_api_key_argument, add_set_argument, positive_float, positive_int
from launch.errors import UsageError
from launch.image_lock import resolve_image
from launch.plan import plan_for
from launch.settings import read_settings
from smoke.agent_api import DEFAULT_CONCURRENCY
from smoke.checks import CHECK_KEYS
from smoke.smoke_run import STDIN, SmokeOptions, smoke_check
from smoke.verdict import exit_status, format_table, to_json

NAME = "check"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="check a started server against its profile")
    parser.add_argument("--profile", help="profile the server was started with (default $PROFILE)")
    add_set_argument(parser)
    parser.add_argument("--url", help="server base URL (default http://127.0.0.1:<HOST_PORT>)")
    parser.add_argument(
        "--log",
        help="server log file, or - for standard input (default: the compose service's "
        "container logs, through the Docker Engine API)",
    )
    parser.add_argument(
        "--no-log", action="store_true", help="skip the log checks (only when no log can be had)"
    )
    parser.add_argument("--service", help="compose service to read from a multi-service log")
    parser.add_argument("--timeout", type=positive_float, default=1800.0,
                        help="seconds to wait for the server to come up (default 1800)")
    parser.add_argument("--request-timeout", type=positive_float, default=60.0,
                        help="seconds each request may take (default 60)")
    add_api_key_argument(parser)
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=DEFAULT_CONCURRENCY,
        help=f"simultaneous requests of the concurrency check (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--context-tokens",
        type=positive_int,
        help="long-context check length (default the profile's smoke.context_tokens)",
    )
    parser.add_argument("--only", choices=CHECK_KEYS, action="append", default=[],
                        help="run only these request checks (repeatable)")  # fmt: skip
    parser.add_argument("--skip", choices=CHECK_KEYS, action="append", default=[],
                        help="skip these request checks (repeatable)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="machine-readable verdict")
    return parser


def server_url(text: str) -> str:
    """A server base URL: http or https with a host."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError("--url", text, "must be an http:// or https:// URL with a host",
                         "e.g. --url http://127.0.0.1:8000")  # fmt: skip
    return text


def log_argument(log: str | None, no_log: bool) -> Path | str | None:
    """`--log` as the core takes it: a file, standard input, or None (the containers)."""
    if no_log or log is None:
        return None
    if log == STDIN:
        if sys.stdin.isatty():
            raise UsageError("--log", STDIN, "standard input is a terminal, not a log",
                             "pipe the log in (docker logs vllm 2>&1 | ...) or pass --log FILE")
        return STDIN
    if not Path(log).is_file():
        raise UsageError("--log", log, "is not a readable file",
                         "pass the server's log file, or - to read standard input")
    return Path(log)


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args.sets)
    if not (args.profile or settings.get("PROFILE")):
        raise UsageError("--profile", None, "no profile given", "pass --profile or set PROFILE")
    log = log_argument(args.log, args.no_log)
    plan = plan_for(settings, args.profile)
    options = SmokeOptions(
        url=server_url(args.url) if args.url else settings.url(plan.profile.deployment.port),
        api_key=args.api_key or settings.client_api_key(),
        log=log, no_log=args.no_log, service=args.service, timeout=args.timeout,
        request_timeout=args.request_timeout, concurrency=args.concurrency,
        context_tokens=args.context_tokens, only=tuple(args.only), skip=tuple(args.skip),
    )  # fmt: skip
    image = plan.profile.deployment.image
    checks = smoke_check(plan, options, predict=lambda p: predict_start(
        p, resolve_image(image, settings.merged)))  # fmt: skip
    if args.json:
        print(to_json(checks, profile=plan.profile.name, url=options.url,
                      deviations=[str(d) for d in plan.deviations]))  # fmt: skip
    else:
        if plan.deviations:
            print("deviations from the qualified profile:\n  "
                  + "\n  ".join(map(str, plan.deviations)))  # fmt: skip
        print(format_table(checks))
    return exit_status(checks)

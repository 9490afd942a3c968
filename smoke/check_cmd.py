"""`python -m smoke check`: readiness, chat completions, and the log's geometry vs the profile.

The log is the compose service's own, read through the Docker Engine API (`smoke.containers`),
unless `--log FILE` or `--log -` gives one from elsewhere. Exit 0 when every check passes, 1 when
a check failed, 2 for bad usage, unreadable input or no Docker engine to read from.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from launch.cli_args import add_set_argument
from launch.compose_env import default_url, user_settings
from launch.errors import ProfileError
from launch.plan import build_plan
from smoke.agent_api import DEFAULT_CONCURRENCY
from smoke.api import Server, served_context
from smoke.checks import CHECK_KEYS, Context, run_request_checks
from smoke.containers import ContainerLogs, connect, find_service_containers
from smoke.log_facts import LogFacts
from smoke.logparse import LogParser
from smoke.ready import LogSource, LogTail, settle_log, wait_ready
from smoke.verdict import exit_status, format_table, geometry_checks, to_json

NAME = "check"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="check a started server against its profile")
    parser.add_argument(
        "--profile",
        default=os.environ.get("PROFILE"),
        help="profile the server was started with (default $PROFILE)",
    )
    add_set_argument(parser)
    parser.add_argument("--url", help="server base URL (default http://127.0.0.1:<profile port>)")
    parser.add_argument(
        "--log",
        help="server log file, or - for standard input (default: the compose service's "
        "container logs, through the Docker Engine API)",
    )
    parser.add_argument(
        "--no-log", action="store_true", help="skip the log checks (only when no log can be had)"
    )
    parser.add_argument("--service", help="compose service to read from a multi-service log")
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds to wait for the server to come up (default 1800)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        help="seconds each request may take (default 60)",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="bearer token (default $VLLM_API_KEY)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"simultaneous requests of the concurrency check (default {DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        help="long-context check length (default the profile's smoke.context_tokens)",
    )
    parser.add_argument("--only", choices=CHECK_KEYS, action="append", default=[],
                        help="run only these request checks (repeatable)")  # fmt: skip
    parser.add_argument("--skip", choices=CHECK_KEYS, action="append", default=[],
                        help="skip these request checks (repeatable)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="machine-readable verdict")
    return parser


def engine_hash_block(facts: LogFacts) -> int | None:
    """The prefix-cache hash block the engine's geometry line reports, if it has been read."""
    value = facts.kv_geometry and facts.kv_geometry.hash_block
    return value if isinstance(value, int) and value > 0 else None


def run(args: argparse.Namespace) -> int:
    if not args.profile:
        raise ProfileError("--profile", None, "no profile given", "pass --profile or set PROFILE")
    if args.no_log:
        args.log = None
    elif args.log == "-" and sys.stdin.isatty():
        raise ProfileError(
            "--log",
            "-",
            "standard input is a terminal, not a log",
            "pipe the log in (docker logs vllm 2>&1 | ...) or pass --log FILE",
        )
    log_path = None
    if args.log and args.log != "-":
        log_path = Path(args.log)
        if not log_path.is_file():
            raise ProfileError(
                "--log",
                args.log,
                "is not a readable file",
                "pass the server's log file, or - to read standard input",
            )
    for name, value in (("--concurrency", args.concurrency),
                        ("--context-tokens", args.context_tokens)):  # fmt: skip
        if value is not None and value < 1:
            raise ProfileError(name, value, "must be a positive number", f"e.g. {name} 8")
    plan = build_plan(args.profile, args.sets, os.environ, None, user_settings())
    profile = plan.profile
    url = args.url or default_url(profile)
    server = Server(url, profile.engine.model_id, args.api_key, args.request_timeout,
                    reasoning=profile.engine.reasoning_parser is not None)  # fmt: skip
    parser = LogParser()
    tail: LogSource = LogTail(log_path, parser)
    if not args.log and not args.no_log:
        client = connect()
        tail = ContainerLogs(find_service_containers(client, profile.name), parser)
        print(f"reading the log of {tail.describe()}", file=sys.stderr, flush=True)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    checks = [wait_ready(server, args.timeout, tail, progress, service=args.service)]
    if checks[0].ok:
        server = dataclasses.replace(server, max_model_len=served_context(server))
        ctx = Context(server, profile, args.concurrency, args.context_tokens,
                      hash_block=engine_hash_block(parser.result(args.service)))  # fmt: skip
        checks += run_request_checks(ctx, tuple(args.only), tuple(args.skip))
    if args.log == "-":
        for line in sys.stdin:
            parser.feed(line)
    else:
        settle_log(tail)
    if not args.no_log:
        checks += geometry_checks(profile, parser.result(args.service))
    if args.json:
        print(to_json(checks, profile=profile.name, url=url,
                      deviations=[str(d) for d in plan.deviations]))  # fmt: skip
    else:
        if plan.deviations:
            print("deviations from the qualified profile:\n  "
                  + "\n  ".join(map(str, plan.deviations)))  # fmt: skip
        print(format_table(checks))
    return exit_status(checks)

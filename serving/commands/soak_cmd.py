"""`python -m serving soak`: a started server under mixed load for `--duration`, a line per
`--interval`, a receipt rewritten after each line (`serving.soak`). Exit 0 when no request failed
and the server's RSS grew within `--max-rss-growth-mib`, 1 otherwise, 2 on bad usage."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from pathlib import Path

from launch.cli_args import (
    duration,
    positive_float,
    positive_int,
)
from launch.docker_api import engine_errors
from launch.errors import UsageError
from launch.sizes import MIB
from serving import receipt as receipts
from serving.bench.cells import BenchError, RequestSettings, metrics_or_none
from serving.bench.session import MAX_CONCURRENCY
from serving.served import add_served_arguments, served
from serving.soak import (
    PROCESS_RSS,
    IntervalLine,
    RssReader,
    Soak,
    SoakOptions,
    receipt_body,
    verdict,
)
from smoke.client import Server
from smoke.containers import connect, containers_rss, serving_containers
from smoke.metrics import gauge_values

NAME = "soak"
UNTIMED_TIMEOUT_S = 60.0
LONG_PROMPT_MAX = 16384
"""The long prompts' default length: a quarter of max_model_len, at most this."""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    defaults = SoakOptions(duration_s=0, concurrency=0, long_prompt_tokens=0)
    p = subparsers.add_parser(NAME, help="hold a started server under mixed load, line per minute")
    add_served_arguments(p)
    p.add_argument("--duration", type=duration, required=True, help="e.g. 3m, 30m, 8h")
    p.add_argument(
        "--interval",
        type=duration,
        default=defaults.interval_s,
        help="one line per interval (default 60s)",
    )
    p.add_argument(
        "--concurrency",
        type=positive_int,
        help="requests in flight (default the profile's engine.max_num_seqs)",
    )
    p.add_argument(
        "--long-prompt-tokens",
        type=positive_int,
        help=f"length of the long prompts (default a quarter of max_model_len, at "
        f"most {LONG_PROMPT_MAX})",
    )
    p.add_argument("--max-tokens", type=positive_int, default=defaults.max_tokens)
    p.add_argument(
        "--max-rss-growth-mib",
        type=positive_float,
        default=defaults.max_rss_growth_mib,
        help="fail when the server's RSS grows more from the end of the first "
        "interval to the end (default %(default)g MiB)",
    )
    p.add_argument("--request-timeout", type=positive_float, default=defaults.request_timeout_s)
    p.add_argument(
        "--out", type=Path, help="receipt path (default results/soak-<profile>-<time>.json)"
    )
    return p


def options_for(
    args: argparse.Namespace, max_num_seqs: int | None, max_model_len: int | None, tools: bool
) -> SoakOptions:
    """The soak's options from the command line and the profile, or UsageError."""
    concurrency = args.concurrency or max_num_seqs
    if concurrency is None:
        raise UsageError(
            "--concurrency",
            None,
            "the profile sets no engine.max_num_seqs (vLLM then picks one by GPU)",
            "pass --concurrency N (SOAK_ARGS=...)",
        )
    if concurrency > MAX_CONCURRENCY:
        raise UsageError(
            "--concurrency",
            concurrency,
            f"is above {MAX_CONCURRENCY}",
            "pass the server's max_num_seqs or fewer",
        )
    long_tokens = args.long_prompt_tokens or min(LONG_PROMPT_MAX, (max_model_len or 16384) // 4)
    if max_model_len is not None and long_tokens + args.max_tokens > max_model_len:
        raise UsageError(
            "--long-prompt-tokens",
            long_tokens,
            f"plus --max-tokens {args.max_tokens} is more than the profile's "
            f"max_model_len {max_model_len}",
            "pass a shorter --long-prompt-tokens",
        )
    if args.duration < 2 * args.interval:
        raise UsageError(
            "--duration",
            f"{args.duration:g}s",
            f"is shorter than two intervals of "
            f"{args.interval:g}s: the end of the first interval is the RSS baseline",
            "soak longer, or pass a shorter --interval",
        )
    return SoakOptions(
        duration_s=args.duration,
        concurrency=concurrency,
        long_prompt_tokens=long_tokens,
        interval_s=args.interval,
        max_tokens=args.max_tokens,
        max_rss_growth_mib=args.max_rss_growth_mib,
        request_timeout_s=args.request_timeout,
        tools=tools,
    )


def rss_reader(profile: str, server: Server) -> tuple[RssReader, str]:
    """How the server's memory is read, and the words the receipt uses for it: the compose
    service's containers through the Docker Engine API (every process of the server) when the
    URL is the port the compose project publishes, else the API server process alone from
    /metrics (a server this host's engine does not run)."""
    try:
        containers = serving_containers(connect(), profile, server.base_url)
    except UsageError as err:
        why = err.rule

        async def from_metrics() -> int | None:
            text = await metrics_or_none(server)
            value = gauge_values(text).get(PROCESS_RSS) if text else None
            return None if value is None else int(value)

        return from_metrics, f"the API server process alone (/metrics {PROCESS_RSS}; {why})"

    async def from_engine() -> int | None:
        try:
            return await asyncio.to_thread(containers_rss, containers)
        except engine_errors():
            return None

    names = ", ".join(c.name for c in containers)
    return from_engine, f"resident memory of container {names} (Docker Engine API)"


def run(args: argparse.Namespace) -> int:
    server_of = served(args.profile, args.sets, args.url, args.api_key)
    plan, url, api_key = server_of.plan, server_of.url, server_of.api_key
    engine = plan.profile.engine
    options = options_for(
        args, engine.max_num_seqs, engine.max_model_len, bool(engine.enable_auto_tool_choice)
    )
    now = dt.datetime.now(dt.UTC)
    out = args.out or Path("results") / f"soak-{plan.profile.name}-{now:%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    server = Server(url, engine.model_id, api_key, UNTIMED_TIMEOUT_S)
    rss, rss_source = rss_reader(plan.profile.name, server)
    head = receipts.head(receipts.SOAK_KIND, plan.profile.name, now.isoformat(timespec="seconds"),
                         plan.to_json(), receipts.image_record(plan.profile.deployment.image,
                                                               server_of.settings))  # fmt: skip
    mix = ", ".join(k.name for k in options.mix())
    print(
        f"soak {plan.profile.name} at {url}: {options.concurrency} in flight for "
        f"{options.duration_s:g} s ({mix}); RSS: {rss_source}",
        flush=True,
    )

    def on_line(line: IntervalLine) -> None:
        print(line.text(soak.lines[0].rss_bytes), flush=True)
        receipts.write_checked(
            out,
            {
                **head,
                "soak": receipt_body(options, soak.lines, verdict(soak.lines, options), rss_source),
            },
        )

    soak = Soak(
        options,
        server_of.target,
        RequestSettings(server, options.max_tokens, options.request_timeout_s),
        rss,
        on_line,
    )
    try:
        asyncio.run(soak.run())
    except BenchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    result = verdict(soak.lines, options)
    receipts.write_atomic(
        out, {**head, "soak": receipt_body(options, soak.lines, result, rss_source)}
    )
    growth = (
        "?"
        if result.rss_growth_bytes is None
        else f"{result.rss_growth_bytes / MIB:+.0f} MiB"
    )
    summary = (
        f"{result.requests} requests, {result.failed} failed, RSS {growth} from the end "
        f"of the first interval (bound {options.max_rss_growth_mib:g} MiB)"
    )
    if result.passed:
        print(f"soak PASS: {summary}; receipt: {out}")
        return 0
    print(f"soak FAIL: {'; '.join(result.problems)}; receipt: {out}")
    return 1

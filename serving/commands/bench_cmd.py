"""`python -m serving bench`: the seeds' qualification run against a started server, as a receipt.

Cells, in order: decode at each concurrency (default 1 and 16) for `--duration` seconds after
`--warmup`, `--repeats` times; prefill of exactly `--prefill-tokens` prompt tokens,
`--prefill-repeats` times; one parity request; the prefix-reuse cell. The receipt is rewritten
after every cell; `--resume` skips the cells it already holds (`serving.bench.session`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from launch.cli_args import positive_float, positive_int
from launch.errors import UsageError
from launch.plan import Plan
from serving import receipt as receipts
from serving.bench.cells import BenchError, RequestSettings
from serving.bench.plot import write_png
from serving.bench.session import (
    CELL_KINDS,
    MAX_CONCURRENCY,
    BenchOptions,
    reuse_sizes,
    run_cells,
)
from serving.served import add_served_arguments, served
from smoke.client import Server
from smoke.containers import connect, find_service_containers, logs_since_start
from smoke.logparse import parse_lines

NAME = "bench"
CONTAINER_LOG = "container"
UNTIMED_TIMEOUT_S = 60.0
"""Timeout of the bench's untimed requests (/tokenize, /metrics)."""


def concurrency(text: str) -> int:
    value = positive_int(text)
    if value > MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"{text} is above {MAX_CONCURRENCY} simultaneous streams")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="qualification bench: decode, prefill, parity")
    add_served_arguments(p)
    p.add_argument(
        "--log",
        nargs="?",
        const=CONTAINER_LOG,
        help="server log FILE: capacity, geometry and GPU names; `--log` alone reads the compose "
        "service's containers through the Docker Engine API",
    )
    p.add_argument("--out", type=Path, help="receipt path (default results/<profile>-<time>.json)")
    p.add_argument("--resume", action="store_true", help="keep the cells --out already holds")
    p.add_argument("--plot", action="store_true",
                   help="also draw the receipt as a PNG beside it (<receipt>.png)")  # fmt: skip
    defaults = BenchOptions()
    p.add_argument("--concurrency", type=concurrency, nargs="+", default=list(defaults.concurrency))
    p.add_argument("--duration", type=positive_float, default=defaults.duration)
    p.add_argument("--warmup", type=positive_float, default=defaults.warmup)
    p.add_argument("--repeats", type=positive_int, default=defaults.repeats)
    p.add_argument("--max-tokens", type=positive_int, default=defaults.max_tokens,
                   help="max_tokens of each decode request (they restart when done)")
    p.add_argument("--prefill-tokens", type=positive_int, default=defaults.prefill_tokens)
    p.add_argument("--prefill-repeats", type=positive_int, default=defaults.prefill_repeats)
    p.add_argument("--parity-prompt-tokens", type=positive_int,
                   default=defaults.parity_prompt_tokens)
    p.add_argument("--parity-max-tokens", type=positive_int, default=defaults.parity_max_tokens)
    p.add_argument(
        "--reuse-tokens",
        type=positive_int,
        help="prefix-reuse cell: length of the prompt sent again (default the smaller of 32768 "
        "and half the profile's max_model_len)",
    )
    p.add_argument(
        "--reuse-evict-tokens",
        type=positive_int,
        help="prefix-reuse cell: tokens of other prompts sent in between (default the log's KV "
        "cache tokens + 10%%, so the first prompt leaves the GPU cache)",
    )
    p.add_argument("--skip", choices=CELL_KINDS, action="append", default=[])
    p.add_argument("--request-timeout", type=positive_float, default=defaults.request_timeout)
    return p  # fmt: skip


def log_record(log: str | None, profile: str) -> dict[str, Any] | None:
    """The receipt's facts from the server log (a file, or the service's containers)."""
    if log is None:
        return None
    if log == CONTAINER_LOG:
        facts = parse_lines(logs_since_start(find_service_containers(connect(), profile)))
    else:
        path = Path(log)
        if not path.is_file():
            raise UsageError("--log", log, "is not a readable file", "pass the server log")
        with path.open(encoding="utf-8", errors="replace", newline="") as fh:
            facts = parse_lines(fh)
    keys = ("engine_version", "gpu_names", "kv_cache_tokens", "max_concurrency",
            "max_concurrency_tokens", "kv_cache_device", "kv_geometry", "kv_offload", "backends",
            "startup_failed")  # fmt: skip
    plain = facts.to_json()
    return {key: plain[key] for key in keys}


def resumed(out: Path, plan: Plan) -> dict[str, Any]:
    if not out.is_file():
        raise UsageError("--resume", str(out), "has no receipt to resume", "drop --resume")
    try:
        receipt = receipts.load(out)
    except ValueError as err:
        raise UsageError("--resume", str(out), f"cannot be resumed: {err}",
                         "start a new receipt (drop --resume)") from err  # fmt: skip
    if receipt["profile"] != plan.profile.name:
        raise UsageError("--resume", str(out), f"is a receipt of {receipt['profile']}",
                         f"use a receipt of {plan.profile.name}")  # fmt: skip
    return receipt


def run(args: argparse.Namespace) -> int:
    server_of = served(args.profile, args.sets, args.url, args.api_key)
    settings, plan, url, api_key = (server_of.settings, server_of.plan, server_of.url,
                                    server_of.api_key)  # fmt: skip
    target = server_of.target
    options = BenchOptions(
        concurrency=tuple(args.concurrency), duration=args.duration, warmup=args.warmup,
        repeats=args.repeats, max_tokens=args.max_tokens, prefill_tokens=args.prefill_tokens,
        prefill_repeats=args.prefill_repeats, parity_prompt_tokens=args.parity_prompt_tokens,
        parity_max_tokens=args.parity_max_tokens, reuse_tokens=args.reuse_tokens,
        reuse_evict_tokens=args.reuse_evict_tokens, skip=tuple(args.skip),
        request_timeout=args.request_timeout,
    )  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    out = args.out or Path("results") / f"{plan.profile.name}-{now:%Y%m%dT%H%M%SZ}.json"
    if args.resume:
        receipt = resumed(out, plan)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        receipt = receipts.new(
            plan.profile.name, now.isoformat(timespec="seconds"), plan.to_json(),
            receipts.image_record(plan.profile.deployment.image, settings),
            log_record(args.log, plan.profile.name), dataclasses.asdict(options),
        )  # fmt: skip
    server = Server(url, plan.profile.engine.model_id, api_key, UNTIMED_TIMEOUT_S)
    requests_ = RequestSettings(server, options.max_tokens, options.request_timeout)
    reuse = None
    if "reuse" not in options.skip:
        reuse = reuse_sizes(options, plan.profile.engine.max_model_len, receipt.get("log"))
        if reuse is None:
            receipt["skipped"] = {"reuse": "the GPU cache size is unknown: no --log and no "
                                  "--reuse-evict-tokens"}  # fmt: skip
    try:
        asyncio.run(run_cells(options, target, requests_, receipt, out, reuse))
    except BenchError as err:
        receipts.save(out, receipt)
        print(f"error: {err}", file=sys.stderr)
        return 1
    receipts.save(out, receipt)
    print(f"receipt: {out}")
    if args.plot:
        print(f"plot: {write_png([(out.stem, receipt)], out.with_suffix('.png'))}")
    return 0

"""`python -m smoke bench`: the seeds' qualification run against a started server, as a receipt.

Cells, in order: decode at each concurrency (default 1 and 16) for `--duration` seconds after
`--warmup`, `--repeats` times; prefill of exactly `--prefill-tokens` prompt tokens,
`--prefill-repeats` times; one parity request. The receipt is rewritten after every cell;
`--resume` skips the cells it already holds.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

from launch.cli_args import add_set_argument
from launch.compose_env import default_url, user_settings
from launch.errors import ProfileError
from launch.image_lock import PIN_KEYS, read_lock, resolve_image
from launch.plan import build_plan
from smoke.bench import receipt as receipts
from smoke.bench.cells import (
    BenchError,
    Settings,
    decode_cell,
    parity_cell,
    prefill_cell,
    prefix_reuse_cell,
)
from smoke.bench.client import Target
from smoke.containers import connect, find_service_containers, logs_since_start
from smoke.logparse import parse_lines

NAME = "bench"
CONTAINER_LOG = "container"


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value

    return parse


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(NAME, help="qualification bench: decode, prefill, parity")
    p.add_argument("--profile", default=os.environ.get("PROFILE"))
    add_set_argument(p)
    p.add_argument("--url", help="server base URL (default http://127.0.0.1:<profile port>)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument(
        "--log",
        nargs="?",
        const=CONTAINER_LOG,
        help="server log FILE: capacity, geometry and GPU names; `--log` alone reads the compose "
        "service's containers through the Docker Engine API",
    )
    p.add_argument("--out", type=Path, help="receipt path (default results/<profile>-<time>.json)")
    p.add_argument("--resume", action="store_true", help="keep the cells --out already holds")
    p.add_argument("--concurrency", type=_positive(int), nargs="+", default=[1, 16])
    p.add_argument("--duration", type=_positive(float), default=30.0)
    p.add_argument("--warmup", type=_positive(float), default=5.0)
    p.add_argument("--repeats", type=_positive(int), default=3)
    p.add_argument(
        "--max-tokens",
        type=_positive(int),
        default=4096,
        help="max_tokens of each decode request (they restart when done)",
    )
    p.add_argument("--prefill-tokens", type=_positive(int), default=32768)
    p.add_argument("--prefill-repeats", type=_positive(int), default=3)
    p.add_argument("--parity-prompt-tokens", type=_positive(int), default=25210)
    p.add_argument("--parity-max-tokens", type=_positive(int), default=3072)
    p.add_argument(
        "--reuse-tokens",
        type=_positive(int),
        help="prefix-reuse cell: length of the prompt sent again (default the smaller of 32768 "
        "and half the profile's max_model_len)",
    )
    p.add_argument(
        "--reuse-evict-tokens",
        type=_positive(int),
        help="prefix-reuse cell: tokens of other prompts sent in between (default the log's KV "
        "cache tokens + 10%%, so the first prompt leaves the GPU cache)",
    )
    p.add_argument("--skip", choices=["decode", "prefill", "parity", "reuse"], action="append",
                   default=[])  # fmt: skip
    p.add_argument("--request-timeout", type=_positive(float), default=600.0)
    return p


def _image(source: str) -> dict[str, Any]:
    try:
        ref = resolve_image(source, os.environ)
    except ProfileError:
        ref = None
    lock = read_lock()
    return {
        "ref": ref,
        "source": source,
        "source_lock": lock.get(PIN_KEYS[source].replace("_IMAGE", "_SOURCE_LOCK")) or None,
    }


def _log_facts(log: str | None, profile: str) -> dict[str, Any] | None:
    if log is None:
        return None
    if log == CONTAINER_LOG:
        client = connect()
        facts = parse_lines(logs_since_start(find_service_containers(client, profile)))
    else:
        path = Path(log)
        if not path.is_file():
            raise ProfileError("--log", log, "is not a readable file", "pass the server log")
        with path.open(encoding="utf-8", errors="replace", newline="") as fh:
            facts = parse_lines(fh)
    keys = ("engine_version", "gpu_names", "kv_cache_tokens", "max_concurrency",
            "max_concurrency_tokens", "kv_cache_device", "kv_geometry", "kv_offload", "backends",
            "startup_failed")  # fmt: skip
    plain = facts.to_json()
    return {key: plain[key] for key in keys}


async def run_cells(args: argparse.Namespace, target: Target, settings: Settings,
                    receipt: dict[str, Any], out: Path,
                    reuse: tuple[int, int] | None) -> None:  # fmt: skip
    cells = receipt["cells"]

    async def cell(name: str, kind: str, runs: int, make) -> None:  # type: ignore[no-untyped-def]
        if name in cells and len(cells[name]["samples"]) >= runs:
            print(f"{name}: kept from {out}", flush=True)
            return
        samples = []
        for i in range(runs):
            sample = await make(i)
            samples.append(sample)
            print(f"{name} run {i + 1}/{runs}: {_brief(sample)}", flush=True)
        cells[name] = {"kind": kind, "samples": samples,
                       "summary": receipts.summarize(kind, samples)}  # fmt: skip
        receipts.save(out, receipt)

    for c in [] if "decode" in args.skip else args.concurrency:
        await cell(
            f"decode-c{c}",
            "decode",
            args.repeats,
            lambda _i, c=c: decode_cell(target, settings, c, args.duration, args.warmup),
        )
    if "prefill" not in args.skip:
        await cell(
            f"prefill-{args.prefill_tokens}",
            "prefill",
            args.prefill_repeats,
            lambda i: prefill_cell(target, settings, args.prefill_tokens, i),
        )
    if "parity" not in args.skip:
        await cell("parity", "parity", 1,
                   lambda _i: parity_cell(target, settings, args.parity_prompt_tokens,
                                          args.parity_max_tokens))  # fmt: skip
    if reuse is None and "reuse" in (receipt.get("skipped") or {}):
        print(f"reuse: skipped, {receipt['skipped']['reuse']}", flush=True)
    if reuse is not None:
        length, evict = reuse
        await cell(f"reuse-{length}", "prefix_reuse", 1,
                   lambda _i: prefix_reuse_cell(target, settings, length, evict,
                                                length))  # fmt: skip


def reuse_sizes(args: argparse.Namespace, max_model_len: int | None,
                log: dict[str, Any] | None) -> tuple[int, int] | None:  # fmt: skip
    """(prompt length, evicting tokens) of the prefix-reuse cell: to leave the GPU cache the
    first prompt must be followed by more tokens than the cache holds, which the log says;
    None (the cell is skipped, and the receipt says why) when nothing says how many."""
    length = args.reuse_tokens or min(32768, max_model_len // 2 if max_model_len else 32768)
    if args.reuse_evict_tokens:
        return length, args.reuse_evict_tokens
    held = (log or {}).get("kv_cache_tokens")
    return (length, int(held * 1.1)) if held else None


def _brief(sample: dict[str, Any]) -> str:
    if sample["kind"] == "decode":
        steps = sample["target_steps_s"]
        return (f"{sample['output_tok_s']:.1f} tok/s"
                + (f", {steps:.2f} target steps/s" if steps else "")
                + f", {sample['requests_failed']} failed")  # fmt: skip
    if sample["kind"] == "prefill":
        return f"{sample['prompt_tok_s']:.0f} prompt tok/s" if sample["ok"] else sample["error"]
    if sample["kind"] == "prefix_reuse":
        return (f"TTFT {sample['ttft_first_s']:.3f} s, again after "
                f"{sample['evicting_tokens']:,} other tokens {sample['ttft_repeat_s']:.3f} s; "
                f"host tier served {sample['host_tier_hit_tokens']} tokens")  # fmt: skip
    return sample.get("sha256") or sample.get("error", "")


def run(args: argparse.Namespace) -> int:
    if not args.profile:
        raise ProfileError("--profile", None, "no profile given", "pass --profile or set PROFILE")
    plan = build_plan(args.profile, args.sets, os.environ, None, user_settings())
    url = args.url or default_url(plan.profile)
    try:
        target = Target.from_url(url, args.api_key)
    except ValueError as err:
        raise ProfileError("--url", url, str(err), "e.g. --url http://127.0.0.1:8000") from err
    now = dt.datetime.now(dt.UTC)
    out = args.out or Path("results") / f"{plan.profile.name}-{now:%Y%m%dT%H%M%SZ}.json"
    if args.resume:
        if not out.is_file():
            raise ProfileError("--resume", str(out), "has no receipt to resume", "drop --resume")
        try:
            receipt = receipts.load(out)
        except ValueError as err:
            raise ProfileError("--resume", str(out), f"cannot be resumed: {err}",
                               "start a new receipt (drop --resume)") from err  # fmt: skip
        if receipt["profile"] != plan.profile.name:
            raise ProfileError(
                "--resume",
                str(out),
                f"is a receipt of {receipt['profile']}",
                f"use a receipt of {plan.profile.name}",
            )
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        receipt = receipts.new(
            plan.profile.name, now.isoformat(timespec="seconds"), plan.to_json(),
            _image(plan.profile.deployment.image), _log_facts(args.log, plan.profile.name),
            {k: (str(v) if isinstance(v, Path) else v)
             for k, v in vars(args).items() if k not in {"api_key", "func"}},
        )  # fmt: skip
    settings = Settings(plan.profile.engine.model_id, args.max_tokens, args.request_timeout)
    max_len = plan.profile.engine.max_model_len
    reuse = None if "reuse" in args.skip else reuse_sizes(args, max_len, receipt.get("log"))
    if reuse is None and "reuse" not in args.skip:
        receipt["skipped"] = {"reuse": "the GPU cache size is unknown: no --log and no "
                              "--reuse-evict-tokens"}  # fmt: skip
    try:
        asyncio.run(run_cells(args, target, settings, receipt, out, reuse))
    except BenchError as err:
        receipts.save(out, receipt)
        print(f"error: {err}", file=sys.stderr)
        return 1
    receipts.save(out, receipt)
    print(f"receipt: {out}")
    return 0

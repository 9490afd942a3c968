"""One bench run on typed options: which cells, how long, how many, into one receipt that is
rewritten after every cell (`--resume` keeps the cells it holds, as `vllm bench sweep` does).
The receipt records the options as they are here, so renaming a command-line flag does not
change the receipt."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving import receipt as receipts
from serving.bench.cells import (
    RequestSettings,
    decode_cell,
    parity_cell,
    prefill_cell,
    prefix_reuse_cell,
)
from serving.bench.client import Target

CELL_KINDS = ("decode", "prefill", "parity", "reuse")
MAX_CONCURRENCY = 4096
"""More simultaneous streams than any profile's max_num_seqs by far; a bound, so a mistyped
`--concurrency` is refused instead of starting millions of tasks."""


@dataclass(frozen=True)
class BenchOptions:
    concurrency: tuple[int, ...] = (1, 16)
    duration: float = 30.0
    warmup: float = 5.0
    repeats: int = 3
    max_tokens: int = 4096
    prefill_tokens: int = 32768
    prefill_repeats: int = 3
    parity_prompt_tokens: int = 25210
    parity_max_tokens: int = 3072
    reuse_tokens: int | None = None
    reuse_evict_tokens: int | None = None
    skip: tuple[str, ...] = ()
    request_timeout: float = 600.0


def reuse_sizes(options: BenchOptions, max_model_len: int | None,
                log: dict[str, Any] | None) -> tuple[int, int] | None:  # fmt: skip
    """(prompt length, evicting tokens) of the prefix-reuse cell: to leave the GPU cache the
    first prompt must be followed by more tokens than the cache holds, which the log says;
    None (the cell is skipped, and the receipt says why) when nothing says how many."""
    length = options.reuse_tokens or min(32768, max_model_len // 2 if max_model_len else 32768)
    if options.reuse_evict_tokens:
        return length, options.reuse_evict_tokens
    held = (log or {}).get("kv_cache_tokens")
    return (length, int(held * 1.1)) if held else None


def brief(sample: dict[str, Any]) -> str:
    """One sample as the progress line shows it."""
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


async def run_cells(options: BenchOptions, target: Target, settings: RequestSettings,
                    receipt: dict[str, Any], out: Path,
                    reuse: tuple[int, int] | None) -> None:  # fmt: skip
    """Every cell the options ask for that `receipt` does not hold yet, saved after each."""
    cells = receipt["cells"]

    async def cell(name: str, kind: str, runs: int,
                   make: Callable[[int], Awaitable[dict[str, Any]]]) -> None:  # fmt: skip
        if name in cells and len(cells[name]["samples"]) >= runs:
            print(f"{name}: kept from {out}", flush=True)
            return
        samples = []
        for i in range(runs):
            sample = await make(i)
            samples.append(sample)
            print(f"{name} run {i + 1}/{runs}: {brief(sample)}", flush=True)
        cells[name] = {"kind": kind, "samples": samples,
                       "summary": receipts.summarize(kind, samples)}  # fmt: skip
        receipts.save(out, receipt)

    for c in () if "decode" in options.skip else options.concurrency:
        await cell(f"decode-c{c}", "decode", options.repeats,
                   lambda _i, c=c: decode_cell(target, settings, c, options.duration,
                                               options.warmup))  # fmt: skip
    if "prefill" not in options.skip:
        await cell(f"prefill-{options.prefill_tokens}", "prefill", options.prefill_repeats,
                   lambda i: prefill_cell(target, settings, options.prefill_tokens, i))
    if "parity" not in options.skip:
        await cell("parity", "parity", 1,
                   lambda _i: parity_cell(target, settings, options.parity_prompt_tokens,
                                          options.parity_max_tokens))  # fmt: skip
    if reuse is None and "reuse" in (receipt.get("skipped") or {}):
        print(f"reuse: skipped, {receipt['skipped']['reuse']}", flush=True)
    if reuse is not None:
        length, evict = reuse
        await cell(f"reuse-{length}", "prefix_reuse", 1,
                   lambda _i: prefix_reuse_cell(target, settings, length, evict,
                                                length))  # fmt: skip

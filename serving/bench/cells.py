"""The seeds' qualification cells: sustained decode, exact-length prefill, and output parity.

Each cell returns a plain dict sample (the receipt keeps every one). Decode cells hold N
concurrent streaming requests for a fixed window after a warm-up and count the tokens the server
reported inside the window; prefill cells send a prompt of exactly the requested token count
(checked with the server's /tokenize and again with the response's usage); parity sends a fixed
greedy request and hashes the output.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import secrets
import statistics
import time
from dataclasses import dataclass
from typing import Any

from serving.bench.client import StreamResult, Target, request_json, stream_chat
from smoke.client import CheckFailed, RequestError, Server, exact_messages, metrics_text
from smoke.metrics import (
    EXTERNAL_HITS,
    PREFIX_HITS,
    acceptance_length,
    counter_totals,
    generation_tokens,
    parse_counter,
    spec_counters,
)

DECODE_PROMPT = "hello"
"""The decode cells' prompt: context zero, as the seeds' sustained-decode runs."""
RUN_ID = secrets.token_hex(4)
"""Starts every prefill prompt of this process: a bench run again on the same server must not be
served from the prefix cache the previous run filled."""


class BenchError(Exception):
    """A cell that cannot be measured as asked (the message says why)."""


@dataclass(frozen=True)
class RequestSettings:
    """What every cell's requests share: the server (model, key; its untimed requests, such as
    /tokenize and /metrics, go through `smoke.client`), max_tokens of a decode request, and the
    timeout of a timed one."""

    server: Server
    max_tokens: int = 4096
    request_timeout: float = 600.0

    @property
    def model(self) -> str:
        return self.server.model_id


def chat_payload(model: str, prompt: str, max_tokens: int, *, stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return json.dumps(body).encode()


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99),
            "mean": statistics.fmean(ordered)}  # fmt: skip


def tokens_in_window(result: StreamResult, t0: float, t1: float) -> int:
    before = after = 0
    for t, tokens in result.marks:
        if t < t0:
            before = tokens
        if t <= t1:
            after = tokens
    return max(0, after - before)


def itl_in_window(result: StreamResult, t0: float, t1: float) -> list[float]:
    """Seconds per token between consecutive arrivals inside the window."""
    out = []
    marks = result.marks
    for (ta, na), (tb, nb) in itertools.pairwise(marks):
        if t0 <= ta and tb <= t1 and nb > na:
            out.extend([(tb - ta) / (nb - na)] * (nb - na))
    return out


async def metrics_or_none(server: Server) -> str | None:
    """`/metrics` read off the event loop (the timed streams go on meanwhile); None when the
    server does not answer it."""
    try:
        return await asyncio.to_thread(metrics_text, server)
    except (CheckFailed, RequestError):
        return None


@dataclass(frozen=True)
class CounterRead:
    """The server's counters, read at an instant somewhere between `start` and `end`
    (perf_counter seconds): on a loaded host one /metrics read can take seconds, so a window
    that starts when a read returns is shorter than the one the counters cover."""

    totals: dict[str, float]
    start: float
    end: float

    @property
    def mid(self) -> float:
        return (self.start + self.end) / 2


async def read_counters(server: Server) -> CounterRead:
    start = time.perf_counter()
    text = await metrics_or_none(server)
    return CounterRead(counter_totals(text or ""), start, time.perf_counter())


async def decode_cell(target: Target, settings: RequestSettings, concurrency: int, duration: float,
                      warmup: float) -> dict[str, Any]:  # fmt: skip
    """Hold `concurrency` streams for `warmup` + `duration` seconds; measure the window."""
    payload = chat_payload(settings.model, DECODE_PROMPT, settings.max_tokens, stream=True)
    results: list[StreamResult] = []
    stop = asyncio.Event()

    async def worker() -> None:
        while not stop.is_set():
            result = StreamResult(t_queued=time.perf_counter())
            results.append(result)
            task = asyncio.ensure_future(
                stream_chat(target, payload, timeout=settings.request_timeout, result=result)
            )
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
            stopped.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    workers = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    await asyncio.sleep(warmup)
    first = await read_counters(settings.server)
    # the second read starts `duration` after the first did: midpoint to midpoint is then
    # `duration` when the two reads take as long
    await asyncio.sleep(max(0.0, first.start + duration - time.perf_counter()))
    last = await read_counters(settings.server)
    stop.set()
    await asyncio.gather(*workers, return_exceptions=True)
    before, generated_before = spec_counters(first.totals), generation_tokens(first.totals)
    after, generated_after = spec_counters(last.totals), generation_tokens(last.totals)
    # the window runs between the reads' midpoints; the counters' own instants are known only
    # to lie within each read, so the kit's count between the reads' ends and between their
    # starts bound what the server's counter may show
    t0, t1 = first.mid, last.mid
    window = t1 - t0
    tokens = sum(tokens_in_window(r, t0, t1) for r in results)
    bounds = [sum(tokens_in_window(r, a, b) for r in results)
              for a, b in ((first.end, last.start), (first.start, last.end))]  # fmt: skip
    started = [r for r in results if t0 <= r.t_sent <= t1]
    ttft = [r.t_first - r.t_sent for r in started if r.t_first is not None]
    itl = [gap for r in results for gap in itl_in_window(r, t0, t1)]
    failed = [r for r in results if r.error and not r.cancelled]
    tok_s = tokens / window
    accept = acceptance_length(before, after)
    return {
        "kind": "decode",
        "concurrency": concurrency,
        "window_s": window,
        "output_tokens": tokens,
        "output_tok_s": tok_s,
        # the server's own generated-token counter over the same window: a check on the count
        "server_output_tok_s": None
        if generated_before is None or generated_after is None
        else (generated_after - generated_before) / window,
        "server_output_tokens": None
        if generated_before is None or generated_after is None
        else generated_after - generated_before,
        # the kit's count between the two /metrics reads (inner: from the first read's end to
        # the second's start; outer: start to end), and how long each read took
        "output_tokens_between_reads": {"inner": bounds[0], "outer": bounds[1]},
        "metrics_read_s": [first.end - first.start, last.end - last.start],
        "acceptance_length": accept,
        "target_steps_s": tok_s / accept if accept else None,
        "ttft_s": percentiles(ttft),
        "itl_s": percentiles(itl),
        "client_queue_s": percentiles([r.t_sent - r.t_queued for r in started]),
        "requests_started": len(started),
        "requests_failed": len(failed),
        "failures": sorted({r.error or "" for r in failed}),
        "spec_counters": {"before": before and before.__dict__, "after": after and after.__dict__},
    }


async def exact_prompt(settings: RequestSettings, tokens: int, salt: str) -> str:
    """A prompt opening with `salt` whose chat-templated length is exactly `tokens`, by the
    server's tokenizer (`smoke.client.exact_messages`, off the event loop)."""

    def messages(filler: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"{salt} {filler}"}]

    try:
        built = await asyncio.to_thread(exact_messages, settings.server, tokens, messages)
    except (CheckFailed, RequestError) as err:
        raise BenchError(f"no {tokens:,}-token prompt: {err}") from err
    return built[0]["content"]


async def prefill_cell(target: Target, settings: RequestSettings, tokens: int,
                       run: int) -> dict[str, Any]:  # fmt: skip
    prompt = await exact_prompt(settings, tokens, f"prefill {RUN_ID} run {run}:")
    payload = chat_payload(settings.model, prompt, 1, stream=True)
    result = await stream_chat(target, payload, timeout=settings.request_timeout)
    if not result.ok or result.t_first is None:
        return {"kind": "prefill", "prompt_tokens": tokens, "ok": False,
                "error": result.error or "no token arrived"}  # fmt: skip
    if result.prompt_tokens != tokens:
        raise BenchError(
            f"server counted {result.prompt_tokens} prompt tokens, /tokenize said {tokens}"
        )
    ttft = result.t_first - result.t_sent
    return {"kind": "prefill", "prompt_tokens": tokens, "ok": True, "ttft_s": ttft,
            "prompt_tok_s": tokens / ttft}  # fmt: skip


async def parity_cell(target: Target, settings: RequestSettings, prompt_tokens: int,
                      max_tokens: int) -> dict[str, Any]:  # fmt: skip
    prompt = await exact_prompt(settings, prompt_tokens, "parity:")
    body = json.loads(chat_payload(settings.model, prompt, max_tokens, stream=False))
    status, data = await request_json(target, "POST", "/v1/chat/completions", body,
                                      timeout=settings.request_timeout)  # fmt: skip
    if status != 200 or not isinstance(data, dict):
        return {"kind": "parity", "ok": False, "error": f"HTTP {status}"}
    text = data["choices"][0]["message"]["content"] or ""
    usage = data.get("usage") or {}
    return {
        "kind": "parity",
        "ok": True,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


async def _ttft(target: Target, settings: RequestSettings, prompt: str, tokens: int) -> float:
    result = await stream_chat(target, chat_payload(settings.model, prompt, 1, stream=True),
                               timeout=settings.request_timeout)  # fmt: skip
    if not result.ok or result.t_first is None:
        raise BenchError(f"a {tokens}-token prompt failed: {result.error or 'no token arrived'}")
    return result.t_first - result.t_sent


def _delta(before: str, after: str, name: str) -> float | None:
    a, b = parse_counter(before, name), parse_counter(after, name)
    return None if a is None or b is None else b - a


async def prefix_reuse_cell(target: Target, settings: RequestSettings, prompt_tokens: int,
                            evict_tokens: int, evict_len: int) -> dict[str, Any]:  # fmt: skip
    """A long prompt, then other prompts totalling `evict_tokens` (more than the GPU KV cache
    holds) so its blocks are evicted, then the first prompt again. Without a host tier the
    repeat is prefilled from scratch; with one it is loaded back, and the server's
    external-prefix-cache counter says how many tokens came that way."""
    anchor = await exact_prompt(settings, prompt_tokens, f"reuse {RUN_ID} anchor:")
    first = await _ttft(target, settings, anchor, prompt_tokens)
    evictors = -(-evict_tokens // evict_len)
    for i in range(evictors):
        prompt = await exact_prompt(settings, evict_len, f"reuse {RUN_ID} evict {i}:")
        await _ttft(target, settings, prompt, evict_len)
    before = await metrics_or_none(settings.server) or ""
    repeat = await _ttft(target, settings, anchor, prompt_tokens)
    after = await metrics_or_none(settings.server) or ""
    gpu_hits = _delta(before, after, PREFIX_HITS)
    return {
        "kind": "prefix_reuse",
        "prompt_tokens": prompt_tokens,
        "evicting_prompts": evictors,
        "evicting_tokens": evictors * evict_len,
        "ttft_first_s": first,
        "ttft_repeat_s": repeat,
        "repeat_speedup": first / repeat,
        "gpu_cache_hit_tokens": gpu_hits,
        "host_tier_hit_tokens": _delta(before, after, EXTERNAL_HITS),
        # the first prompt must have left the GPU cache for the cell to mean anything
        "evicted": None if gpu_hits is None else gpu_hits == 0,
    }

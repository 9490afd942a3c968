"""A soak: a started server held under mixed load for minutes or hours, a line per interval, a
receipt at the end.

What breaks a server that runs for days does not show in a bench's seconds: a request kind that
fails now and then, memory that grows with every request, a cache that fills and stays full.
The soak keeps `concurrency` requests in flight (the profile's max_num_seqs unless told) with
the bench's client, cycling through `MIX`: short and long prompts, streamed and whole, some
with a tool. At the end of each interval it reads the server's /metrics (KV usage, requests
waiting, preemptions) and its memory, and prints one `IntervalLine`. When the duration is up no
new request starts and the ones in flight finish (none is cut), inside the last interval. It
fails on any failed request, and on RSS growth past the bound from the end of the first
interval (the warm baseline) to the end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import secrets
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from launch.sizes import MIB
from serving.bench.cells import (
    RequestSettings,
    exact_prompt,
    itl_in_window,
    metrics_or_none,
    tokens_in_window,
)
from serving.bench.client import StreamResult, Target, request_json, stream_chat
from smoke.agent_api import TOOL_PROMPT, WEATHER_TOOL
from smoke.client import RequestError
from smoke.metrics import (
    KV_USAGE,
    P50,
    P99,
    PREEMPTIONS,
    RUNNING,
    WAITING,
    counter_totals,
    gauge_values,
)

PROCESS_RSS = "process_resident_memory_bytes"
"""prometheus_client's gauge of the API server process's own RSS, in vLLM's /metrics."""
SHORT_PROMPT = "Write a few sentences about the sea."


@dataclass(frozen=True)
class Kind:
    """One kind of request in the mix."""

    stream: bool
    long: bool = False
    tools: bool = False

    @property
    def name(self) -> str:
        size = "tools" if self.tools else "long" if self.long else "short"
        return f"{size}-{'stream' if self.stream else 'whole'}"


MIX = (
    Kind(True),
    Kind(False),
    Kind(True, long=True),
    Kind(False, tools=True),
    Kind(True),
    Kind(True, tools=True),
    Kind(False, long=True),
    Kind(True),
)
"""The request kinds in the order they are sent, round and round: half streamed short
prompts (the usual chat), long prompts streamed and whole, tool requests streamed and whole."""


@dataclass(frozen=True)
class SoakOptions:
    duration_s: float
    concurrency: int
    long_prompt_tokens: int
    interval_s: float = 60.0
    max_tokens: int = 256
    max_rss_growth_mib: float = 1024.0
    request_timeout_s: float = 600.0
    tools: bool = True
    """Send the tool kinds (a server without auto tool choice answers them 400)."""

    @property
    def intervals(self) -> int:
        return math.ceil(self.duration_s / self.interval_s - 1e-9)

    def mix(self) -> tuple[Kind, ...]:
        return tuple(k for k in MIX if self.tools or not k.tools)


@dataclass
class Request:
    """One request of the soak: its kind and what arrived (a whole response is one mark)."""

    kind: Kind
    result: StreamResult
    ended: float | None = None

    @property
    def failed(self) -> bool:
        return self.ended is not None and not self.result.ok


@dataclass(frozen=True)
class ServerSample:
    """The server at one instant: /metrics and its memory (None where unreadable)."""

    kv_usage: float | None
    running: float | None
    waiting: float | None
    preemptions: float | None
    rss_bytes: int | None


@dataclass(frozen=True)
class IntervalLine:
    end_s: float
    requests: int
    failed: int
    output_tok_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    kv_usage: float | None
    waiting: float | None
    preemptions: float | None
    rss_bytes: int | None
    failures: list[str] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)
    """Requests that ended in the interval, by kind."""

    def text(self, baseline_rss: int | None) -> str:
        """The line a user watches."""

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value * 1000:.0f}"

        minutes, seconds = divmod(round(self.end_s), 60)
        rss = "RSS ?"
        if self.rss_bytes is not None:
            rss = f"RSS {self.rss_bytes / (1 << 30):.2f} GiB"
            if baseline_rss is not None:
                rss += f" ({(self.rss_bytes - baseline_rss) / MIB:+.0f} MiB)"
        kv = "-" if self.kv_usage is None else f"{self.kv_usage:.2f}"
        preempted = "-" if self.preemptions is None else f"{self.preemptions:.0f}"
        return (
            f"{minutes:3d}:{seconds:02d}  requests {self.requests} ({self.failed} failed)  "
            f"{self.output_tok_s:.1f} tok/s  TTFT p50 {ms(self.ttft_p50_s)} p99 "
            f"{ms(self.ttft_p99_s)} ms  ITL p50 {ms(self.itl_p50_s)} p99 "
            f"{ms(self.itl_p99_s)} ms  KV {kv}  waiting {self.waiting or 0:.0f}  "
            f"preempted {preempted}  {rss}"
        )


def quantile(values: list[float], q: float) -> float | None:
    """The `q` quantile (statistics' inclusive method); None without values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def interval_line(
    requests: list[Request],
    t0: float,
    t1: float,
    start: float,
    before: ServerSample,
    after: ServerSample,
) -> IntervalLine:
    """The line of [t0, t1] from the requests that ended in it or are still in flight."""
    ended = [r for r in requests if r.ended is not None and t0 <= r.ended <= t1]
    ttft = [
        r.result.t_first - r.result.t_sent
        for r in requests
        if r.kind.stream and r.result.t_first is not None and t0 <= r.result.t_first <= t1
    ]
    itl = [gap for r in requests if r.kind.stream for gap in itl_in_window(r.result, t0, t1)]
    tokens = sum(tokens_in_window(r.result, t0, t1) for r in requests)
    preempted = None
    if after.preemptions is not None and before.preemptions is not None:
        preempted = after.preemptions - before.preemptions
    failed = [r for r in ended if r.failed]
    return IntervalLine(
        end_s=t1 - start,
        requests=len(ended),
        failed=len(failed),
        output_tok_s=tokens / (t1 - t0) if t1 > t0 else 0.0,
        ttft_p50_s=quantile(ttft, P50),
        ttft_p99_s=quantile(ttft, P99),
        itl_p50_s=quantile(itl, P50),
        itl_p99_s=quantile(itl, P99),
        kv_usage=after.kv_usage,
        waiting=after.waiting,
        preemptions=preempted,
        rss_bytes=after.rss_bytes,
        failures=sorted({f"{r.kind.name}: {r.result.error}" for r in failed}),
        by_kind=dict(Counter(r.kind.name for r in ended)),
    )


def forget_finished(requests: list[Request], t1: float) -> list[Request]:
    """The requests still in flight at `t1`, their marks before it cut to the last one (what
    the next interval counts from); a soak of hours keeps no history in memory."""
    flying = [r for r in requests if r.ended is None or r.ended > t1]
    for r in flying:
        earlier = [m for m in r.result.marks if m[0] < t1]
        if len(earlier) > 1:
            r.result.marks[: len(earlier) - 1] = []
    return flying


@dataclass(frozen=True)
class Verdict:
    requests: int
    failed: int
    rss_growth_bytes: int | None
    rss_bound_bytes: int
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems


def verdict(lines: list[IntervalLine], options: SoakOptions) -> Verdict:
    """Pass or fail: no failed request, RSS growth from the end of the first interval to the
    end within the bound, and an RSS to measure it with."""
    requests = sum(line.requests for line in lines)
    failed = sum(line.failed for line in lines)
    bound = int(options.max_rss_growth_mib * MIB)
    problems = []
    if failed:
        kinds = sorted({f for line in lines for f in line.failures})
        problems.append(f"{failed} of {requests} requests failed ({'; '.join(kinds[:5])})")
    if not requests:
        problems.append("no request finished")
    growth = None
    first, last = lines[0].rss_bytes if lines else None, lines[-1].rss_bytes if lines else None
    if first is None or last is None:
        problems.append("the server's RSS could not be read: the RSS bound is unchecked")
    else:
        growth = last - first
        if growth > bound:
            problems.append(
                f"RSS grew {growth / MIB:.0f} MiB from the end of the first interval "
                f"to the end, past the bound of {options.max_rss_growth_mib:g} MiB"
            )
    return Verdict(requests, failed, growth, bound, problems)


def payload(
    kind: Kind, serial: int, run_id: str, model: str, long_prompt: str, max_tokens: int
) -> dict[str, Any]:
    """The chat request of one soak request: a prefix unique to it (so the prefix cache serves
    none of the prompt), the kind's prompt and tools."""
    prompt = TOOL_PROMPT if kind.tools else long_prompt if kind.long else SHORT_PROMPT
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": f"soak {run_id} #{serial}: {prompt}"}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if kind.tools:
        body.update(tools=[WEATHER_TOOL], tool_choice="auto")
    else:
        body["ignore_eos"] = True
    if kind.stream:
        body.update(
            stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}
        )
    return body


async def send(target: Target, request: Request, body: dict[str, Any], timeout: float) -> None:
    """Send one request and fill `request` as it goes (a stream's tokens count while it is in
    flight); never raises: a failure is in its result."""
    result = request.result
    if request.kind.stream:
        await stream_chat(target, json.dumps(body).encode(), timeout=timeout, result=result)
    else:
        result.t_sent = time.perf_counter()
        try:
            status, data = await request_json(
                target, "POST", "/v1/chat/completions", body, timeout=timeout
            )
        except (OSError, TimeoutError, RequestError) as err:
            result.error = f"connection failed: {err}"
        else:
            result.status = status
            choices = data.get("choices") if isinstance(data, dict) else None
            usage = data.get("usage") if isinstance(data, dict) else None
            if status != 200:
                result.error = f"HTTP {status}: {str(data)[:120]}"
            elif not choices or not isinstance(usage, dict):
                result.error = f"no choices or usage in {str(data)[:120]}"
            else:
                result.done = True
                result.completion_tokens = int(usage.get("completion_tokens") or 0)
                result.marks.append((time.perf_counter(), result.completion_tokens))
    request.ended = time.perf_counter()


def read_sample(text: str | None, rss_bytes: int | None) -> ServerSample:
    """A `ServerSample` from a /metrics text (None: the read failed)."""
    if text is None:
        return ServerSample(None, None, None, None, rss_bytes)
    gauges, counters = gauge_values(text), counter_totals(text)
    return ServerSample(
        gauges.get(KV_USAGE),
        gauges.get(RUNNING),
        gauges.get(WAITING),
        counters.get(PREEMPTIONS),
        rss_bytes,
    )


RssReader = Callable[[], Awaitable[int | None]]


@dataclass
class Soak:
    """One soak run: its requests and lines; `on_line` sees each line as it is made."""

    options: SoakOptions
    target: Target
    settings: RequestSettings
    rss: RssReader
    on_line: Callable[[IntervalLine], None]
    run_id: str = field(default_factory=lambda: secrets.token_hex(4))
    lines: list[IntervalLine] = field(default_factory=list)
    _requests: list[Request] = field(default_factory=list)

    async def sample(self) -> ServerSample:
        return read_sample(await metrics_or_none(self.settings.server), await self.rss())

    async def run(self) -> list[IntervalLine]:
        options = self.options
        long_prompt = await exact_prompt(self.settings, options.long_prompt_tokens, "soak")
        mix, serials = options.mix(), itertools.count()
        start = time.perf_counter()
        deadline = start + options.duration_s

        async def worker() -> None:
            while time.perf_counter() < deadline:
                serial = next(serials)
                kind = mix[serial % len(mix)]
                body = payload(
                    kind, serial, self.run_id, self.settings.model, long_prompt, options.max_tokens
                )
                request = Request(kind, StreamResult(t_queued=time.perf_counter()))
                self._requests.append(request)  # an interval counts its tokens in flight
                await send(self.target, request, body, options.request_timeout_s)

        before = await self.sample()
        workers = [asyncio.ensure_future(worker()) for _ in range(options.concurrency)]
        t0 = start
        for k in range(1, options.intervals + 1):
            if k < options.intervals:
                await asyncio.sleep(max(0.0, start + k * options.interval_s - time.perf_counter()))
            else:
                await asyncio.gather(*workers)
            t1 = time.perf_counter()
            after = await self.sample()
            line = interval_line(self._requests, t0, t1, start, before, after)
            self.lines.append(line)
            self.on_line(line)
            self._requests = forget_finished(self._requests, t1)
            t0, before = t1, after
        return self.lines


def receipt_body(
    options: SoakOptions, lines: list[IntervalLine], result: Verdict, rss_source: str
) -> dict[str, Any]:
    """The soak's part of its receipt."""
    return {
        "options": asdict(options),
        "mix": [k.name for k in options.mix()],
        "rss_source": rss_source,
        "lines": [asdict(line) for line in lines],
        "verdict": {**asdict(result), "passed": result.passed},
    }

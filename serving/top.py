"""`make top`: the server while it serves, a line per interval from two reads of its /metrics
(no Prometheus needed): requests in the batch and queued, KV cache usage, requests, prompt and
generated tokens per second, TTFT and inter-token p50/p99 of the requests in the interval (from
the histograms' bucket deltas, as Prometheus' histogram_quantile computes them), the prefix
cache's hit rate, the draft's acceptance length, and preemptions. Pure: two readings in, a view
out; the command reads and prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from smoke.metrics import (
    FINISHED,
    GENERATION,
    ITL,
    KV_USAGE,
    P50,
    P99,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT,
    RUNNING,
    TTFT,
    WAITING,
    acceptance_length,
    counter_totals,
    gauge_values,
    histogram_buckets,
    histogram_quantile,
    spec_counters,
)


@dataclass(frozen=True)
class Reading:
    """One read of /metrics: counters and histograms summed over label sets, gauges."""

    at: float
    counters: dict[str, float]
    gauges: dict[str, float]
    histograms: dict[str, dict[float, float]]


def reading(text: str, at: float) -> Reading:
    return Reading(at, counter_totals(text), gauge_values(text), histogram_buckets(text))


@dataclass(frozen=True)
class View:
    seconds: float
    running: float | None
    waiting: float | None
    kv_usage: float | None
    requests_per_s: float | None
    prompt_tok_s: float | None
    generation_tok_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    prefix_hit_rate: float | None
    acceptance_length: float | None
    preemptions: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def cells(self) -> list[tuple[str, str]]:
        """(column, value as shown) for each figure, in the order the view shows them."""

        def f(value: float | None, fmt: str, scale: float = 1.0) -> str:
            return "-" if value is None else format(value * scale, fmt)

        ms = lambda v: f(v, ".0f", 1e3)  # noqa: E731
        return [
            ("running", f(self.running, ".0f")), ("waiting", f(self.waiting, ".0f")),
            ("KV", f(self.kv_usage, ".1%")), ("req/s", f(self.requests_per_s, ".2f")),
            ("prompt/s", f(self.prompt_tok_s, ".0f")), ("gen/s", f(self.generation_tok_s, ".1f")),
            ("TTFT50", ms(self.ttft_p50_s)), ("TTFT99", ms(self.ttft_p99_s)),
            ("ITL50", ms(self.itl_p50_s)), ("ITL99", ms(self.itl_p99_s)),
            ("prefix", f(self.prefix_hit_rate, ".0%")),
            ("accept", f(self.acceptance_length, ".2f")),
            ("preempted", f(self.preemptions, ".0f")),
        ]  # fmt: skip

    def line(self) -> str:
        return "  ".join(f"{name} {value}" for name, value in self.cells())


SERVER = "server"
"""The first column of the screen: each row's server (its name, or the URL's port)."""


def screen(rows: Sequence[tuple[str, View | str]], stamp: str, interval_s: float) -> str:
    """One screen: a title, the column names, a row per server (a server that did not answer
    shows why instead of its figures). Pure text; the command clears the terminal first."""
    names = [SERVER, *(name for name, _ in _EMPTY.cells())]
    table = [names]
    notes = []
    for server, shown in rows:
        if isinstance(shown, View):
            table.append([server, *(value for _, value in shown.cells())])
        else:
            notes.append(f"{server}: {shown}")
    widths = [max(len(row[i]) for row in table) for i in range(len(names))]
    lines = [f"glm53 top  {stamp}  every {interval_s:g} s: tokens/s, latencies p50/p99 in ms, "
             "prefix-cache hits, acceptance length  (Ctrl-C ends)", ""]
    lines += ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in
                        enumerate(zip(row, widths, strict=True))) for row in table]  # fmt: skip
    return "\n".join([*lines, *notes]) + "\n"


def _delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float | None:
    if name not in after:
        return None
    return max(after[name] - before.get(name, 0.0), 0.0)  # a restart resets a counter


def _bucket_delta(before: Reading, after: Reading, family: str) -> dict[float, float]:
    old, new = before.histograms.get(family, {}), after.histograms.get(family, {})
    return {le: max(n - old.get(le, 0.0), 0.0) for le, n in new.items()}


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or not bottom else top / bottom


def view(before: Reading, after: Reading) -> View:
    """What the server did between two readings, and its gauges at the second."""
    secs = after.at - before.at
    per_s = lambda name: _ratio(_delta(before.counters, after.counters, name), secs)  # noqa: E731
    ttft, itl = _bucket_delta(before, after, TTFT), _bucket_delta(before, after, ITL)
    hits = _delta(before.counters, after.counters, PREFIX_HITS)
    queries = _delta(before.counters, after.counters, PREFIX_QUERIES)
    return View(
        seconds=secs,
        running=after.gauges.get(RUNNING),
        waiting=after.gauges.get(WAITING),
        kv_usage=after.gauges.get(KV_USAGE),
        requests_per_s=per_s(FINISHED),
        prompt_tok_s=per_s(PROMPT),
        generation_tok_s=per_s(GENERATION),
        ttft_p50_s=histogram_quantile(P50, ttft),
        ttft_p99_s=histogram_quantile(P99, ttft),
        itl_p50_s=histogram_quantile(P50, itl),
        itl_p99_s=histogram_quantile(P99, itl),
        prefix_hit_rate=_ratio(hits, queries),
        acceptance_length=acceptance_length(spec_counters(before.counters),
                                            spec_counters(after.counters)),
        preemptions=_delta(before.counters, after.counters, PREEMPTIONS),
    )  # fmt: skip


_EMPTY = View(0.0, *([None] * 13))
"""A view with no figures: the column names when no server answered."""

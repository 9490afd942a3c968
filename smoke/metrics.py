"""vLLM's Prometheus `/metrics`: every metric name the kit reads, written once, read with
prometheus_client's own text parser (the library vLLM exposes them with), and what the
speculative counters imply.

The names are the metric families as vLLM registers them, with no suffix: a counter's sample
in the exposition and in PromQL is `total(name)` (`vllm:generation_tokens_total`), a
histogram's are `name_bucket`, `_sum` and `_count`, a gauge's is its name.

vLLM's mean acceptance length is 1 + accepted / drafts (each draft round yields its accepted
tokens plus the target's own token), and one target step produces that many tokens, so target
steps/s = output tokens/s / acceptance length: the comparison signal that does not move with
acceptance. The bench's receipts and the smoke's checks read the same counters through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
"""Accepted draft tokens by draft position (a counter labelled `position`)."""
GENERATION = "vllm:generation_tokens"
"""The server's own count of generated tokens (a counter, summed over label sets)."""
PREFIX_HITS = "vllm:prefix_cache_hits"
"""Prompt tokens served from the GPU prefix cache (a counter)."""
PREFIX_QUERIES = "vllm:prefix_cache_queries"
"""Prompt tokens looked up in the GPU prefix cache (a counter)."""
EXTERNAL_HITS = "vllm:external_prefix_cache_hits"
"""Prompt tokens served by a KV connector (the host tier), not the GPU cache (a counter)."""
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries"
"""Prompt tokens looked up through a KV connector (a counter)."""
RUNNING = "vllm:num_requests_running"
"""Requests in the engine's batches now (a gauge)."""
WAITING = "vllm:num_requests_waiting"
"""Requests queued for a batch slot now (a gauge)."""
KV_USAGE = "vllm:kv_cache_usage_perc"
"""The share of KV cache blocks in use now, 1 = all (a gauge; cached free blocks are free)."""
TTFT = "vllm:time_to_first_token_seconds"
"""Time to first token (a histogram, seconds)."""
ITL = "vllm:inter_token_latency_seconds"
"""Time between a request's tokens (a histogram, seconds)."""
FINISHED = "vllm:request_success"
"""Requests finished, by finish reason (a counter)."""
PROMPT = "vllm:prompt_tokens"
"""Prompt tokens processed (a counter)."""
PREEMPTIONS = "vllm:num_preemptions"
"""Requests preempted by the scheduler (a counter)."""
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
"""A request's time from arrival to its last token (a histogram, seconds)."""
CACHE_INFO = "vllm:cache_config_info"
"""The KV cache configuration as labels (an info gauge of value 1)."""
P50, P90, P99 = 0.5, 0.9, 0.99
PANEL_QUANTILES = (P50, P90, P99)
"""The latency quantiles the dashboard draws; a terminal line (top, soak) shows P50 and P99."""


def total(counter: str) -> str:
    """A counter's sample name in the exposition and in PromQL."""
    return f"{counter}_total"


def counter_totals(text: str) -> dict[str, float]:
    """Every counter of a /metrics text by its family name (`vllm:x`, no `_total`), summed over
    label sets; the `_created` timestamps prometheus_client adds beside each are not counts.
    A text that is not Prometheus exposition raises ValueError."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name == family.name + "_total":
                totals[family.name] = totals.get(family.name, 0.0) + sample.value
    return totals


def gauge_values(text: str) -> dict[str, float]:
    """Every gauge of a /metrics text by name, summed over label sets (engines, models)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "gauge":
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def parse_counter(text: str, name: str) -> float | None:
    """Counter `name` (its family, as this module names it) from a /metrics text, summed over
    label sets; None when the server exposes none. A sample name (`..._total`) is a caller's
    mistake that would read as "no such counter", so it is refused."""
    if name.endswith("_total"):
        raise ValueError(f"{name}: give the counter's family name (without _total)")
    return counter_totals(text).get(name)


@dataclass(frozen=True)
class SpecCounters:
    drafts: float
    draft_tokens: float
    accepted_tokens: float


def spec_counters(totals: Mapping[str, float]) -> SpecCounters | None:
    """The speculative-decoding counters of `counter_totals`; None when the server exposes none."""
    if not any(metric in totals for metric in COUNTERS.values()):
        return None
    return SpecCounters(**{key: totals.get(metric, 0.0) for key, metric in COUNTERS.items()})


def parse_spec_counters(text: str) -> SpecCounters | None:
    """The speculative-decoding counters of a /metrics text."""
    return spec_counters(counter_totals(text))


def acceptance_length(before: SpecCounters | None, after: SpecCounters | None) -> float | None:
    """Mean acceptance length over an interval, from counter deltas; None without drafts."""
    if before is None or after is None:
        return None
    drafts = after.drafts - before.drafts
    if drafts <= 0:
        return None
    return 1.0 + (after.accepted_tokens - before.accepted_tokens) / drafts


def generation_tokens(totals: Mapping[str, float]) -> float | None:
    """`vllm:generation_tokens_total` of `counter_totals`; None when the server has none."""
    return totals.get(GENERATION)


def parse_generation_tokens(text: str) -> float | None:
    """`vllm:generation_tokens_total` from a /metrics text."""
    return generation_tokens(counter_totals(text))


def histogram_buckets(text: str) -> dict[str, dict[float, float]]:
    """Every histogram of a /metrics text by family: upper bound (`le`, +Inf included) ->
    cumulative count, summed over label sets."""
    found: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "histogram":
            continue
        buckets = found.setdefault(family.name, {})
        for sample in family.samples:
            if sample.name == family.name + "_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return found


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' `histogram_quantile` over cumulative bucket counts: the bucket the q-th
    observation falls in, interpolated linearly within it (from 0 for the first bucket; the
    highest finite bound when it falls in +Inf). None without observations."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = bound, count
    return lower

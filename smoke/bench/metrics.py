"""Speculative-decoding counters from the server's Prometheus `/metrics`, and what they imply.

vLLM's mean acceptance length is 1 + accepted / drafts (each draft round yields its accepted
tokens plus the target's own token), and one target step produces that many tokens, so target
steps/s = output tokens/s / acceptance length: the comparison signal that does not move with
acceptance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eE]+|NaN)\s*$")


@dataclass(frozen=True)
class SpecCounters:
    drafts: float
    draft_tokens: float
    accepted_tokens: float


def parse_spec_counters(text: str) -> SpecCounters | None:
    """Sum each counter over its label sets; None when the server exposes none of them."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    seen = False
    names = {f"{metric}_total": key for key, metric in COUNTERS.items()}
    names.update({metric: key for key, metric in COUNTERS.items()})
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group("name") in names:
            totals[names[match.group("name")]] += float(match.group("value"))
            seen = True
    return SpecCounters(**totals) if seen else None


def acceptance_length(before: SpecCounters | None, after: SpecCounters | None) -> float | None:
    """Mean acceptance length over an interval, from counter deltas; None without drafts."""
    if before is None or after is None:
        return None
    drafts = after.drafts - before.drafts
    if drafts <= 0:
        return None
    return 1.0 + (after.accepted_tokens - before.accepted_tokens) / drafts


GENERATION = "vllm:generation_tokens_total"
"""The server's own count of generated tokens (a counter, summed over label sets)."""


PREFIX_HITS = "vllm:prefix_cache_hits_total"
"""Prompt tokens served from the GPU prefix cache."""
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
"""Prompt tokens served by a KV connector (the host tier), not the GPU cache."""


def parse_counter(text: str, name: str) -> float | None:
    """Counter `name` from a /metrics text, summed over label sets; None when the server has
    none (a `_total` counter may also appear without the suffix)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group("name") in (name, name.removesuffix("_total")):
            total += float(match.group("value"))
            seen = True
    return total if seen else None


def parse_generation_tokens(text: str) -> float | None:
    """`vllm:generation_tokens_total` from a /metrics text; None when the server has none."""
    return parse_counter(text, GENERATION)

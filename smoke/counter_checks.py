"""Checks judged from the server's own Prometheus counters: prefix-cache reuse and speculative
acceptance, the two that fail silently (the server answers, only slower).

- Prefix reuse: a prompt of several hash blocks, with a fresh nonce at its start, is sent twice;
  on the second request `vllm:prefix_cache_hits` must grow by at least the prompt's full hash
  blocks (vLLM looks up at most prompt - 1 tokens, in whole hash blocks). Reported broken at
  DCP > 1: local-inference-lab/vllm#545 (0 hits, warm TTFT equal to cold).
- Speculative acceptance: a short greedy generation; the mean acceptance length over that
  window (1 + accepted / drafts) against the profile's floor (local-inference-lab/vllm#513:
  DFlash acceptance fell by a quarter under DCP without a replicated draft).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from smoke.api import LENGTH_PROMPT
from smoke.check import Check, Label, guard
from smoke.client import (
    FILLER,
    CheckFailed,
    Server,
    decode_json,
    fewest_reaching,
    metrics_text,
    post_json,
    sse_chunks,
)
from smoke.metrics import (
    PREFIX_HITS,
    SpecCounters,
    acceptance_length,
    parse_counter,
    parse_spec_counters,
)

PREFIX_BLOCKS = 4
"""The reuse prompt spans at least this many hash blocks..."""
PREFIX_MIN_TOKENS = 2048
"""...and at least this many tokens (a few thousand: the reuse users report losing)."""
PROMPT_SLACK = 64
"""Room above the prompt's target length: whole sentences overshoot it, and 4 tokens answer."""
COUNTER_SETTLE_S = 5.0
"""vLLM publishes a step's stats after the response; how long to wait for them to show."""
SPEC_MAX_TOKENS = 256


def reuse_prompt(server: Server, tokens: int) -> tuple[list[dict[str, Any]], int]:
    """The shortest messages of at least `tokens` tokens (whole filler sentences), opening with a
    nonce so that no earlier request shares a block with them; and their length."""
    nonce = f"Session {secrets.token_hex(8)}. "

    def messages(n: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": nonce + FILLER * n + "\nReply with exactly READY"}]

    n, count = fewest_reaching(server, tokens, messages)
    return messages(n), count


def timed_request(server: Server, messages: list[dict[str, Any]]) -> float:
    """Seconds to the first streamed chunk of a short direct answer."""
    sent = time.monotonic()
    response = post_json(server, {"messages": messages, "max_tokens": 4, "stream": True},
                          thinking_off=True)  # fmt: skip
    first = None
    for chunk in sse_chunks(server, response):
        if first is None and chunk.get("choices"):
            first = time.monotonic()
    if first is None:
        raise CheckFailed("the stream carried no choice")
    return first - sent


def counter_after(server: Server, name: str, before: float, at_least: float) -> float:
    """Counter `name` once it has grown by `at_least` over `before`, or as it stands after
    COUNTER_SETTLE_S."""
    deadline = time.monotonic() + COUNTER_SETTLE_S
    while True:
        value = parse_counter(metrics_text(server), name)
        if value is None:
            raise CheckFailed(f"the server exposes no {name} (prefix caching off, or not vLLM)")
        if value - before >= at_least or time.monotonic() > deadline:
            return value
        time.sleep(0.25)


def check_prefix_reuse(label: Label, server: Server, hash_block: int, tokens: int) -> Check:
    """A prompt of at least `tokens` tokens, twice; hits counted in `hash_block` units."""
    def body() -> str:
        messages, prompt = reuse_prompt(server, tokens)
        full = (prompt - 1) // hash_block * hash_block
        start = parse_counter(metrics_text(server), PREFIX_HITS)
        if start is None:
            raise CheckFailed(f"the server exposes no {PREFIX_HITS} (prefix caching off?)")
        cold = timed_request(server, messages)
        mid = counter_after(server, PREFIX_HITS, start, 0)
        warm = timed_request(server, messages)
        end = counter_after(server, PREFIX_HITS, mid, full)
        shown = (f"{end - mid:,.0f} of {prompt:,} prompt tokens from the cache on the repeat "
                 f"(TTFT cold {cold * 1000:,.0f} ms, warm {warm * 1000:,.0f} ms)")
        if end - mid < full:
            raise CheckFailed(f"{shown}; its {full // hash_block} full blocks of {hash_block} "
                              f"are {full:,} tokens")  # fmt: skip
        return shown

    expected = f">= the prompt's full {hash_block}-token blocks from vllm:prefix_cache_hits"
    return guard(label, expected, body)


def spec_counters(server: Server) -> SpecCounters:
    counters = parse_spec_counters(metrics_text(server))
    if counters is None:
        raise CheckFailed("the server exposes no vllm:spec_decode_* counters: it does not "
                          "speculate")  # fmt: skip
    return counters


def check_spec_acceptance(label: Label, server: Server, floor: float | None) -> Check:
    def body() -> str:
        before = spec_counters(server)
        decode_json(post_json(server, {"messages": [{"role": "user", "content": LENGTH_PROMPT}],
                                  "max_tokens": server.answer_budget(SPEC_MAX_TOKENS)},
                         thinking_off=True))  # fmt: skip
        deadline = time.monotonic() + COUNTER_SETTLE_S
        while (length := acceptance_length(before, after := spec_counters(server))) is None:
            if time.monotonic() > deadline:
                raise CheckFailed("no draft rounds in the window: speculation did not run")
            time.sleep(0.25)
        drafts = after.drafts - before.drafts
        shown = f"acceptance length {length:.3f} over {drafts:,.0f} draft rounds"
        if floor is not None and length < floor:
            raise CheckFailed(f"{shown}, below the profile's floor {floor}")
        return shown + ("" if floor is not None else " (reported: the profile states no floor)")

    expected = (f"mean acceptance length >= {floor}" if floor is not None
                else "draft rounds counted (no floor in expect)")  # fmt: skip
    return guard(label, expected, body)

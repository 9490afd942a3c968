"""Clients that vanish, on the real engine: `OPENED` streaming requests opened and their
connections closed mid-generation (the engine runs `max_num_seqs` of them, the rest wait for a
slot). vLLM must abort every one: within `IDLE_WITHIN_S` its own gauges show no request running
or waiting and KV cache usage back at its idle value, and the next requests are served."""

from __future__ import annotations

import time
from collections.abc import Callable

import requests

from launch.loader import load
from smoke.client import Server, decode_json, post_json, usage_counts
from smoke.metrics import KV_USAGE, RUNNING, WAITING, gauge_values, parse_generation_tokens
from tests.e2e.harness import (
    HOST_PORT,
    PROFILE,
    Run,
    Step,
    StepFailed,
    container,
    wait_healthy,
)
from tests.e2e.steps.access import EVERY_ROUTE

OPENED = 64
STREAM_TOKENS = 4096
"""Each stream would run for minutes on the CPU engine: it ends only because its client left."""
IDLE_WITHIN_S = 30
BUSY_WITHIN_S = 60
"""How long the opened streams may take to be running or waiting in the engine."""
NEXT = 3
NEXT_TOKENS = 16
"""The requests after the drop: served in full (16 completion tokens each, ignore-EOS)."""


GENERATED = "generated"
"""In `gauges`: the server's generated-token counter beside the three gauges."""


def gauges(server: Server) -> dict[str, float]:
    """Requests running and waiting, KV usage and tokens generated so far, from `/metrics`."""
    response = requests.get(server.url("/metrics"), headers=server.headers(), timeout=10)
    response.raise_for_status()
    text = response.text
    values = gauge_values(text)
    now = {name: values.get(name, float("nan")) for name in (RUNNING, WAITING, KV_USAGE)}
    return {**now, GENERATED: parse_generation_tokens(text) or 0.0}


Reading = dict[str, float]


def wait_for(server: Server, within: float,
             done: Callable[[Reading], bool]) -> tuple[Reading, float]:  # fmt: skip
    """Poll the gauges until `done` holds; the last reading and how long it took."""
    start = time.monotonic()
    while True:
        now = gauges(server)
        if done(now):
            return now, time.monotonic() - start
        if time.monotonic() - start > within:
            raise StepFailed(f"not reached within {within:.0f} s: {now}")
        time.sleep(0.5)


def vanished_clients(run: Run) -> str:
    """On the server the access step left serving, its key in front (the kit's route guard is
    in every request's path, disconnects included)."""
    if run.state.api_key is None:
        raise StepFailed("no server with a key from the access step")
    wait_healthy(run, [container()])
    server = Server(f"http://127.0.0.1:{HOST_PORT}", "kit-tiny-chat", run.state.api_key,
                    timeout=300)  # fmt: skip
    slots = load(PROFILE).profile.engine.max_num_seqs
    idle = gauges(server)
    if idle[RUNNING] or idle[WAITING]:
        raise StepFailed(f"the server is not idle before the step: {idle}")
    body = {"messages": [{"role": "user", "content": "Count on."}],
            "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True}  # fmt: skip
    responses = [post_json(server, body) for _ in range(OPENED)]
    try:
        bad = [r.status_code for r in responses if r.status_code != 200]
        if bad:
            raise StepFailed(f"{len(bad)} of {OPENED} streams refused: {bad[:4]}")
        # dropped mid-generation: every slot runs a stream, the rest wait, and the running
        # ones have decoded tokens since they were opened
        busy, _ = wait_for(server, BUSY_WITHIN_S, lambda g: g[RUNNING] == slots
                           and g[RUNNING] + g[WAITING] == OPENED
                           and g[GENERATED] - idle[GENERATED] >= 2 * slots)  # fmt: skip
    finally:
        for response in responses:
            response.close()
    after, took = wait_for(server, IDLE_WITHIN_S,
                           lambda g: not g[RUNNING] and not g[WAITING]
                           and g[KV_USAGE] <= idle[KV_USAGE])  # fmt: skip
    served = []
    for _ in range(NEXT):
        answer = post_json(server, {"messages": [{"role": "user", "content": "Count on."}],
                                    "max_tokens": NEXT_TOKENS, "ignore_eos": True})  # fmt: skip
        served.append(usage_counts(decode_json(answer))[1] if answer.status_code == 200
                      else answer.status_code)
    if served != [NEXT_TOKENS] * NEXT:
        raise StepFailed(f"the next {NEXT} requests were not served normally (completion tokens "
                         f"or HTTP status): {served}")  # fmt: skip
    return (f"{OPENED} streams opened ({busy[RUNNING]:.0f} running = max_num_seqs, "
            f"{busy[WAITING]:.0f} waiting, KV usage {busy[KV_USAGE]:.3f}, "
            f"{busy[GENERATED] - idle[GENERATED]:.0f} tokens generated) and dropped: "
            f"{took:.1f} s later running {after[RUNNING]:.0f}, waiting {after[WAITING]:.0f}, KV "
            f"usage {after[KV_USAGE]:.3f} (idle {idle[KV_USAGE]:.3f}); the next {NEXT} requests "
            f"answered with {NEXT_TOKENS} tokens each")


VANISHED = Step("64 streams dropped mid-generation: the engine returns to idle",
                vanished_clients, (EVERY_ROUTE,))  # fmt: skip

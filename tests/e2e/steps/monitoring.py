"""The monitoring profile on the real engine: the kit's Prometheus image made from Debian's
package and pinned (beside the CPU image's build), then started with plain `docker compose up`
next to the keyed server the access and soak steps used, scraping it with the key's file. Every
query of every dashboard panel that the CPU engine can answer is asked through Prometheus' HTTP
API and must return series; the panels that need a speculating server or GPUs are named as
such. Prometheus publishes on 127.0.0.1 only, and `make down` keeps its data volume."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import requests

from smoke.client import Server
from smoke.dashboard import PANELS
from tests.e2e.harness import (
    HOST_PORT,
    PROFILE,
    REGISTRY,
    Run,
    Step,
    StepFailed,
    compose,
    container,
    make,
    user_settings,
    volumes,
    wait_healthy,
)
from tests.e2e.steps.access import api_key_file
from tests.e2e.steps.faults import DOWN
from tests.e2e.steps.soak import SOAK

TAG = f"{REGISTRY}/glm53/prometheus:trixie"
PORT = 9090
SCRAPE = "3s"
"""The run's scrape interval (PROMETHEUS_SCRAPE_INTERVAL in compose/.env): rates over the
dashboard's one-minute window need two scrapes, so a short interval keeps the wait short."""
VOLUME = "glm53-prometheus-data"
PROMETHEUS_CONTAINER = "glm53-prometheus-1"
API = f"http://127.0.0.1:{PORT}/api/v1"


def prometheus_image(run: Run) -> str:
    run.sh([sys.executable, "docker/debian_base.py", "--engine", "prometheus", "--tag", TAG,
            "--push"], timeout=600)  # fmt: skip
    run.state.images["prometheus"] = TAG
    make(run, "pin", f"IMAGE={TAG}", "SOURCE=prometheus")
    version = run.sh(["docker", "run", "--rm", TAG, "--version"]).stdout.splitlines()[0]
    return f"PROMETHEUS_IMAGE={run.lock['PROMETHEUS_IMAGE']}: {version}"


def query(expr: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{API}/query", params={"query": expr}, timeout=10)
    answer.raise_for_status()
    return answer.json()["data"]["result"]


def wait_for(what: str, ready: Any, within: float) -> float:
    start = time.monotonic()
    while not ready():
        if time.monotonic() - start > within:
            raise StepFailed(f"{what} not within {within:.0f} s")
        time.sleep(1)
    return time.monotonic() - start


def scraped(run: Run) -> str:
    key = run.state.api_key
    if key is None:
        raise StepFailed("no server with a key from the access step")
    wait_healthy(run, [container()])
    with api_key_file(key), user_settings(f"PROMETHEUS_SCRAPE_INTERVAL={SCRAPE}"):
        make(run, "configure", f"PROFILE={PROFILE}", "MONITORING=1")
        compose(run, "up", "--detach", "prometheus")  # beside the running server, as users do

        def target_up() -> bool:
            try:
                return [s["value"][1] for s in query('up{job="vllm"}')] == ["1"]
            except requests.RequestException:
                return False

        up_after = wait_for("Prometheus scraping the server with the key", target_up, 90)
        server = Server(f"http://127.0.0.1:{HOST_PORT}", "kit-tiny-chat", key)
        for i in range(4):  # fresh traffic for the rates
            requests.post(server.url("/v1/chat/completions"), timeout=60,
                          headers=server.headers(), json={
                              "model": "kit-tiny-chat", "max_tokens": 16,
                              "messages": [{"role": "user", "content": f"count to {i + 3}"}],
                          }).raise_for_status()  # fmt: skip
        asked = [(p, q) for p in PANELS if p.needs is None for q in p.queries]
        empty: list[str] = []

        def all_answered() -> bool:
            empty[:] = [q.expr for _, q in asked if not query(q.expr)]
            return not empty

        try:
            wait_for("every panel's query answered", all_answered, 60)
        except StepFailed as err:
            raise StepFailed(f"{err}: no series for {empty}") from err
        bindings = published(run)
    not_here = sorted({f"{p.title} ({p.needs.value})" for p in PANELS if p.needs is not None})
    return (f"scraping with the key {up_after:.0f} s after `docker compose up -d prometheus`; "
            f"{len(asked)} queries of {len({p.title for p, _ in asked})} panels answered through "
            f"Prometheus' API; published on {bindings}; not answerable on the CPU engine: "
            f"{'; '.join(not_here)}")


def top(run: Run) -> str:
    """`make top --once --json` on the keyed server while requests stream to it: the interval's
    rates and latencies come from the real engine's /metrics."""
    key = run.state.api_key
    if key is None:
        raise StepFailed("no server with a key from the access step")
    server = Server(f"http://127.0.0.1:{HOST_PORT}", "kit-tiny-chat", key)

    stop = threading.Event()

    def load() -> None:  # until top has read its interval, however long its start takes
        i = 0
        while not stop.is_set():
            requests.post(server.url("/v1/chat/completions"), timeout=60,
                          headers=server.headers(), json={
                              "model": "kit-tiny-chat", "max_tokens": 32,
                              "messages": [{"role": "user", "content": f"count to {i + 5}"}],
                          }).raise_for_status()  # fmt: skip
            i += 1

    sender = threading.Thread(target=load)
    sender.start()
    try:
        done = make(run, "top", f"PROFILE={PROFILE}", "TOP_ARGS=--once --json --interval 5",
                    env={"VLLM_API_KEY": key})  # fmt: skip
    finally:
        stop.set()
        sender.join(120)
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    if not shown["generation_tok_s"] or shown["ttft_p50_s"] is None:
        raise StepFailed(f"no generation or TTFT in the interval: {shown}")
    return (f"{shown['seconds']:.1f} s: {shown['generation_tok_s']:.1f} generated tok/s, "
            f"{shown['requests_per_s']:.2f} req/s, TTFT p50 {shown['ttft_p50_s'] * 1e3:.0f} ms, "
            f"running {shown['running']:.0f}, KV usage {shown['kv_usage']:.3f}")


def published(run: Run) -> list[str]:
    """Where the Prometheus container is published (`docker port`): 127.0.0.1 only."""
    lines = run.sh(["docker", "port", PROMETHEUS_CONTAINER]).stdout.splitlines()
    addresses = [line.split(" -> ")[-1] for line in lines if " -> " in line]
    if not addresses or not all(a.startswith("127.0.0.1:") for a in addresses):
        raise StepFailed(f"Prometheus is published on {addresses}, not 127.0.0.1 alone")
    return addresses


def data_kept(run: Run) -> str:
    if VOLUME not in volumes(run):
        raise StepFailed(f"`make down` removed {VOLUME}")
    return f"{VOLUME} is kept (`docker compose down --volumes` removes it)"


PROMETHEUS_IMAGE = Step("Prometheus image from Debian's package, pinned", prometheus_image)
SCRAPED = Step("monitoring profile: Prometheus scrapes the keyed server, every panel answers",
               scraped, (PROMETHEUS_IMAGE, SOAK))  # fmt: skip
TOP = Step("make top --once --json reads the keyed server", top, (SOAK,))
DATA_KEPT = Step("make down stops Prometheus and keeps its data", data_kept, (SCRAPED, DOWN))

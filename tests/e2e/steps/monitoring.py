"""The monitoring profile on the real engine: the kit's Prometheus image made from Debian's
package and pinned (beside the CPU image's build), then started with plain `docker compose up`
next to the keyed server the access and soak steps used, scraping it with the key's file. Every
query of every dashboard panel that the CPU engine can answer is asked through Prometheus' HTTP
API and must return series; the panels that need a speculating server or GPUs are named as
such. Prometheus publishes on 127.0.0.1 only, and `make down` keeps its data volume."""

from __future__ import annotations

import datetime
import json
import sys
import threading
from typing import Any

import requests

from serving.dashboard import PANELS
from smoke.metrics import GENERATION, total
from tests.e2e.harness import (
    HOST_PORT,
    PROFILE,
    REGISTRY,
    REPO,
    Run,
    Step,
    StepFailed,
    chat,
    compose,
    container,
    make,
    user_settings,
    volumes,
    wait_for,
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
URL = f"http://127.0.0.1:{HOST_PORT}"
UP = 'up{job="vllm"}'
"""Whether Prometheus' last scrape of the server succeeded (1) or not (0)."""
TOP_AGREEMENT = 0.25
"""How far `make top`'s rate may be from Prometheus' over the same window: they read the counter
at different instants (Prometheus every 3 s, top at its interval's ends), so a window differs at
its edges by up to a scrape."""


def prometheus_image(run: Run) -> str:
    run.sh([sys.executable, "docker/debian_base.py", "--engine", "prometheus", "--tag", TAG,
            "--push"], timeout=600)  # fmt: skip
    run.state.images["prometheus"] = TAG
    make(run, "pin", f"IMAGE={TAG}", "SOURCE=prometheus")
    version = run.sh(["docker", "run", "--rm", TAG, "--version"]).stdout.splitlines()[0]
    return f"PROMETHEUS_IMAGE={run.lock['PROMETHEUS_IMAGE']}: {version}"


def query(expr: str, at: float | None = None, api: str = API) -> list[dict[str, Any]]:
    """The series `expr` gives at `at` (default now) through the HTTP API at `api`."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    answer = requests.get(f"{api}/query", params=params, timeout=10)
    answer.raise_for_status()
    return answer.json()["data"]["result"]


def query_at(expr: str, at: float) -> float | None:
    """The one value of `expr` at `at` (None when there is none)."""
    found = query(expr, at)
    return float(found[0]["value"][1]) if found else None


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
                return [s["value"][1] for s in query(UP)] == ["1"]
            except requests.RequestException:
                return False

        up_after = wait_for("Prometheus scraping the server with the key", target_up, 90)
        for i in range(4):  # fresh traffic for the rates
            chat(URL, f"count to {i + 3}", 16, timeout=60, api_key=key)
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


TMUX = ["tmux", "-L", "kit-e2e"]
"""A tmux server of the run's own (its socket named), never a user's."""
TOP_INTERVAL_S = 12
TOP_STREAMS = 4


class Load:
    """`TOP_STREAMS` requests of 64 tokens at a time to the keyed server, each sent again when it
    ends, until stopped: a steady generation rate."""

    def __init__(self, key: str) -> None:
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._stream, args=(key, i))
                        for i in range(TOP_STREAMS)]  # fmt: skip

    def _stream(self, key: str, i: int) -> None:
        while not self.stop.is_set():
            chat(URL, f"stream {i}: count", 64, ignore_eos=True, timeout=120, api_key=key)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)


def top_screen(run: Run) -> str:
    return run.sh([*TMUX, "capture-pane", "-p", "-t", "top"]).stdout


def top_row(text: str) -> tuple[str, dict[str, str]] | None:
    """The time and the server's figures of a `make top` screen (None before the first)."""
    lines = [line for line in text.splitlines() if line.strip()]
    title = next((i for i, line in enumerate(lines) if line.startswith("glm53 top  ")), None)
    if title is None or len(lines) < title + 3:
        return None
    header, row = lines[title + 1].split(), lines[title + 2].split()
    return lines[title].split()[2], dict(zip(header, row, strict=False))


def next_screen(run: Run, after: str | None, within: float) -> tuple[str, dict[str, str]]:
    """The first screen whose time is later than `after`."""
    found: list[tuple[str, dict[str, str]]] = []

    def fresh() -> bool:
        row = top_row(top_screen(run))
        if row and (after is None or row[0] > after):
            found.append(row)
        return bool(found)

    wait_for("a new make top screen", fresh, within)
    return found[0]


def top(run: Run) -> str:
    """`make top` as users run it over SSH, in a terminal (tmux): one screen redrawn each
    interval. Idle, then under a steady load: its generation rate moves from 0, and matches what
    Prometheus computes from its own scrapes over the same window (within `TOP_AGREEMENT`: the
    two read the counter at different instants). Then `make top --once --json` for scripts."""
    key = run.state.api_key
    if key is None:
        raise StepFailed("no server with a key from the access step")
    # Prometheus sends the key from compose/secrets: a CI run here emptied the file after the
    # scrape step, every scrape got 401, and Prometheus had no series to compare with
    with api_key_file(key):
        return top_in_tmux(run, key)


def top_in_tmux(run: Run, key: str) -> str:
    env = {**run.env, "VLLM_API_KEY": key}
    run.sh([*TMUX, "new-session", "-d", "-s", "top", "-x", "220", "-y", "12", "-c", str(REPO),
            "make", "--no-print-directory", "top", f"PROFILE={PROFILE}",
            f"TOP_ARGS=--interval {TOP_INTERVAL_S}"], env=env)  # fmt: skip
    try:
        idle_at, idle = next_screen(run, None, 120)
        with Load(key):
            started = datetime.datetime.now().strftime("%H:%M:%S")
            # the first screen whose whole interval ran under the load
            at, _ = next_screen(run, started, 3 * TOP_INTERVAL_S)
            at, busy = next_screen(run, at, 3 * TOP_INTERVAL_S)
            epoch = datetime.datetime.combine(datetime.date.today(),
                                              datetime.time.fromisoformat(at)).timestamp()
            prometheus = query_at(f"sum(rate({total(GENERATION)}[{TOP_INTERVAL_S}s]))", epoch + 0.5)
            done = make(run, "top", f"PROFILE={PROFILE}", "TOP_ARGS=--once --json --interval 5",
                        env={"VLLM_API_KEY": key})  # fmt: skip
    finally:
        run.sh([*TMUX, "kill-server"], check=False)
    still, shown = (float(row["gen/s"]) if row["gen/s"] != "-" else 0.0 for row in (idle, busy))
    if not shown or still > shown / 10:
        raise StepFailed(f"make top's generation did not move under load: idle {idle}, "
                         f"busy {busy}")  # fmt: skip
    if prometheus is None:
        raise StepFailed(f"Prometheus has no generation rate at {at} ({UP}: {query(UP)})")
    ratio = shown / prometheus if prometheus else float("inf")
    if abs(ratio - 1) > TOP_AGREEMENT:
        raise StepFailed(f"make top showed {shown} gen tok/s at {at}, Prometheus computed "
                         f"{prometheus:.1f} over the same {TOP_INTERVAL_S} s (ratio {ratio:.3f})")
    once = json.loads(done.stdout.strip().splitlines()[-1])
    if not once["generation_tok_s"] or once["ttft_p50_s"] is None:
        raise StepFailed(f"make top --once --json: no generation or TTFT in the interval: {once}")
    return (f"in tmux: idle at {idle_at} gen/s {idle['gen/s']}, under {TOP_STREAMS} streams "
            f"{shown} gen tok/s at {at} where Prometheus computed {prometheus:.1f} over the same "
            f"{TOP_INTERVAL_S} s (ratio {ratio:.3f}), TTFT p50 {busy['TTFT50']} ms; --once "
            f"--json: {once['generation_tok_s']:.1f} gen tok/s, TTFT p50 "
            f"{once['ttft_p50_s'] * 1e3:.0f} ms, running {once['running']:.0f}")


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
TOP = Step("make top in tmux: moves under load, agrees with Prometheus; --once --json", top,
           (SOAK, SCRAPED))
DATA_KEPT = Step("make down stops Prometheus and keeps its data", data_kept, (SCRAPED, DOWN))

"""A crash on the real engine: the engine process killed with SIGKILL inside the running
container while requests stream. The streams end with an error within `STREAMS_END_WITHIN_S`
(none hangs), Docker's restart policy brings the service back, and the smoke check passes again,
its verdict giving Docker's restart count and the previous start's root-cause line."""

from __future__ import annotations

import os
import signal
import time

from smoke.client import Server
from smoke.logparse import NO_CAUSE
from tests.e2e.harness import (
    HOST_PORT,
    Run,
    Step,
    StepFailed,
    container,
    smoke_verdict,
    wait_healthy,
)
from tests.e2e.steps.faults import open_streams
from tests.e2e.steps.serving import HEALTHY

ENGINE_TITLE = "VLLM::EngineCore"
"""The process title vLLM gives its engine core process (setproctitle), as `docker top` lists
it: the process that holds the model and the KV cache."""
STREAMS = 4
RESTARTED_WITHIN_S = 60
"""vLLM's API server exits within seconds of its engine's death (its watchdog looks every 5 s)
and Docker's restart policy starts the container again."""
STREAMS_END_WITHIN_S = 30
"""Streams in flight when the engine dies must have ended (with an error) this soon: vLLM's API
server sees the engine process die (its liveness monitor) and fails what it was serving."""


def engine_pid(run: Run, name: str) -> int:
    """The host's process id of the engine core process in container `name` (`docker top`)."""
    rows = run.sh(["docker", "top", name, "-eo", "pid,args"]).stdout.splitlines()[1:]
    found = [int(r.split(None, 1)[0]) for r in rows if ENGINE_TITLE in r]
    if len(found) != 1:
        raise StepFailed(f"{len(found)} {ENGINE_TITLE} processes in {name}: {rows}")
    return found[0]


def restart_count(run: Run, name: str) -> int:
    return int(run.sh(["docker", "inspect", "--format", "{{.RestartCount}}", name]).stdout)


def crash_and_restart(run: Run) -> str:
    name = container()
    wait_healthy(run, [name])
    before = restart_count(run, name)
    server = Server(f"http://127.0.0.1:{HOST_PORT}", "kit-tiny-chat", None, timeout=120)
    streams, threads = open_streams(server, STREAMS)
    pid = engine_pid(run, name)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    for thread in threads:
        thread.join(max(0.0, killed + STREAMS_END_WITHIN_S - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    if hung:
        raise StepFailed(f"{len(hung)} stream(s) still open {STREAMS_END_WITHIN_S} s after the "
                         "engine was killed")  # fmt: skip
    finished = [vars(s) for s in streams if not s.error]
    if finished:
        raise StepFailed(f"streams the dead engine was serving ended without an error: {finished}")
    ends = [round(s.ended - killed, 1) for s in streams]
    while restart_count(run, name) == before:  # vLLM's watchdog ends the API server in seconds
        if time.monotonic() - killed > RESTARTED_WITHIN_S:
            raise StepFailed(f"Docker did not restart {name} within {RESTARTED_WITHIN_S} s")
        time.sleep(0.5)
    wait_healthy(run, [name])
    healthy = time.monotonic() - killed
    after = restart_count(run, name)
    if after != before + 1:
        raise StepFailed(f"Docker's restart count went {before} -> {after}, not up by one")
    verdict = smoke_verdict(run, "--timeout", "240")
    restarts = verdict.checks.get("restarts") or {}
    if verdict.exit_code != 0:
        raise StepFailed(f"smoke after the restart exited {verdict.exit_code}: "
                         f"{verdict.failed()[:2]}")  # fmt: skip
    seen = restarts.get("seen", "")
    if not restarts.get("ok") or f"restarted {after} time(s)" not in seen:
        raise StepFailed(f"the verdict does not report the restart: {restarts}")
    if NO_CAUSE in seen or "exited unexpectedly" not in seen:
        raise StepFailed(f"the verdict has no root-cause line of the crash: {seen}")
    return (f"engine core (host pid {pid}) killed with {STREAMS} streams in flight: they ended "
            f"with errors after {ends} s ({streams[0].error}); healthy again {healthy:.0f} s "
            f"after the kill; smoke passed: {seen[:220]}")


CRASH = Step("engine killed while streaming: Docker restarts it, smoke passes again",
             crash_and_restart, (HEALTHY,))  # fmt: skip

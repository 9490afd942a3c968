"""Wait for a starting server, visibly: elapsed time and the last log line, never a frozen screen.

Loading GLM-5.3-Flash and capturing graphs takes minutes. The wait polls `/health` and
`/v1/models`, reads the server log (a growing file, or the containers through the Docker Engine
API, `smoke.containers`), and stops early when the log shows the engine failed to start, or the
container exited, naming the root cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx

from smoke.check import Check, Label, result, skipped
from smoke.client import RequestError, Server, send
from smoke.containers import Restarts
from smoke.logparse import NO_CAUSE, LogParser, root_cause_of

SERVER_UP = Label("server-up", "ready: server up")
RESTARTS = Label("restarts", "server: no restart during the checks")
PROBE_TIMEOUTS = httpx.Timeout(5.0, connect=2.0)
"""A readiness probe's: a server still starting answers nothing, so it is asked often."""


class LogSource(Protocol):
    """Where the server's log comes from while the smoke check waits."""

    parser: LogParser

    def poll(self) -> None:
        """Feed what arrived since the last call to the parser."""

    def failure(self) -> str | None:
        """Why the server can no longer come up (its process is gone), or None."""

    def status(self) -> str:
        """What the source knows of the server's state ("" for a file)."""

    def restarts(self) -> list[Restarts] | None:
        """Docker's restart count of each container and how its previous start ended (None
        for a file: it says nothing of the process)."""

    def restarts_automatically(self) -> bool:
        """A server whose engine died will be started again (Docker's restart policy)."""


class LogTail:
    """Reads what a growing log file gained since the last call into one parser."""

    def __init__(self, path: Path | None, parser: LogParser) -> None:
        self.path = path
        self.parser = parser
        self.offset = 0

    def failure(self) -> str | None:
        return None  # a file says nothing of the process; the log's own lines do

    def status(self) -> str:
        return ""

    def restarts(self) -> list[Restarts] | None:
        return None

    def restarts_automatically(self) -> bool:
        return False

    def poll(self) -> None:
        if self.path is None or not self.path.is_file():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if cut:
            self.parser.feed(data[:cut].decode("utf-8", "replace"))
            self.offset += cut


def _up(server: Server) -> str | None:
    """None when ready, else why not."""
    try:
        health = send(server, "GET", "/health", timeouts=PROBE_TIMEOUTS)
        if health.status_code != 200:
            return f"/health HTTP {health.status_code}"
        models = send(server, "GET", "/v1/models", timeouts=PROBE_TIMEOUTS)
        if models.status_code != 200:
            return f"/v1/models HTTP {models.status_code}"
    except RequestError as err:
        return f"not reachable ({type(err).__name__})"
    return None


def wait_ready(
    server: Server,
    timeout: float,
    tail: LogSource,
    progress: Callable[[str], None],
    *,
    poll_every: float = 1.0,
    report_every: float = 10.0,
    service: str | None = None,
) -> Check:
    start = time.monotonic()
    last_report = -report_every
    expected = f"/health and /v1/models answer 200 within {timeout:.0f} s"
    while True:
        elapsed = time.monotonic() - start
        why = _up(server)
        if why is None:
            return result(SERVER_UP, expected, f"ready after {elapsed:.0f} s", True)
        tail.poll()
        gone = tail.failure()
        facts = tail.parser.result(service)
        # an engine that died after its start is started again by Docker's restart policy:
        # wait for that start (a start that fails, or a container that stops, ends the wait).
        # Every failed start counts, not the current one alone: a start that failed and the
        # marker of the restart after it can arrive in one poll
        restarts = tail.restarts_automatically()
        crashed = facts.engine_died and restarts
        failed = [f for f in facts.failed_starts if not (f.engine_died and restarts)]
        if failed or gone:
            cause = root_cause_of(failed[-1].errors if failed else facts.errors) or NO_CAUSE
            what = gone or "engine failed to start"
            return result(SERVER_UP, expected, f"{what}: {cause}", False)
        if elapsed >= timeout:
            return result(SERVER_UP, expected, f"{why} after {elapsed:.0f} s", False)
        if elapsed - last_report >= report_every:
            last_line = tail.parser.last_line(service) or "(no log)"
            state = tail.status() + (" (the engine died; Docker starts it again)" if crashed
                                     else "")  # fmt: skip
            progress(
                f"waiting for {server.base_url}: {elapsed:.0f}s elapsed, {why}"
                f"{f' ({state})' if state else ''}; last log line: {last_line[:160]}"
            )
            last_report = elapsed
        time.sleep(min(poll_every, max(0.0, timeout - elapsed)))


def settle_log(source: LogSource, quiet_for: float = 0.5, at_most: float = 5.0) -> None:
    """Read the log until nothing new has arrived for `quiet_for` seconds (the lines of the
    requests just made may still be on their way from the container)."""
    deadline = time.monotonic() + at_most
    seen = -1
    while time.monotonic() < deadline:
        source.poll()
        count = source.parser.lines_seen
        if count == seen:
            return
        seen = count
        time.sleep(quiet_for)


def restart_check(before: list[Restarts] | None, after: list[Restarts] | None) -> Check:
    """No container restarted while the checks ran (a crash under the checks' load that Docker
    papered over); restarts before them are reported with the previous start's root cause."""
    if before is None or after is None:
        return skipped(RESTARTS, "the log is a file; restart counts come from the containers")
    counts = {r.container: r.count for r in before}
    during = [r for r in after if r.count != counts.get(r.container)]
    expected = "Docker's restart count unchanged while the checks ran"
    if during:
        seen = "; ".join(f"{r.container} restarted {r.count - counts.get(r.container, 0)} "
                         f"time(s) during the checks: {r.cause or NO_CAUSE}"
                         for r in during)  # fmt: skip
        return result(RESTARTS, expected, seen, False)
    return result(RESTARTS, expected, "; ".join(r.describe() for r in after) + "; none during "
                  "the checks", True)  # fmt: skip

"""The running service read through the Docker Engine API: its logs, health and exit state.

With no `--log`, the smoke check finds the compose project's vLLM container(s) running the
profile, follows each one's log from the container's start (not from now) into the same
streaming parser, and watches the container's state while it waits: a container that exits or
is OOM-killed ends the wait at once with its exit code and vLLM's root-cause line. One that
Docker's restart policy is restarting is still coming up: its log is followed again from the new
start, which the parser counts as a new start (a start that fails still ends the wait). The
restart count Docker keeps, and how the start before the current one ended, are reported.
The Docker SDK negotiates the API version with the engine (`version="auto"`), so an older
engine works as well as a newer one.

Log lines arrive on one reader thread per container; `poll()` hands them to the parser on the
caller's thread, so the parser is only ever touched by one thread.
"""

from __future__ import annotations

import datetime as dt
import queue
import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from launch import docker_api
from launch.compose_files import PROJECT, SERVICE
from launch.docker_api import engine_errors
from launch.errors import UsageError
from smoke.logparse import NO_CAUSE, LogParser, root_cause_of

SERVICE_PREFIX = SERVICE
"""The vLLM services: `vllm`, or `vllm-0`, `vllm-1`, ... behind the router."""


def connect() -> Any:
    """A Docker client (API version negotiated); exit 2 naming the socket if none answers."""
    return docker_api.connect("give the server log with LOG=FILE")


def find_service_containers(client: Any, profile: str, project: str = PROJECT) -> list[Any]:
    """The project's vLLM containers whose command is this profile, by service name."""
    label = f"com.docker.compose.project={project}"
    found = client.containers.list(all=True, filters={"label": label})
    mine = [
        c
        for c in found
        if c.labels.get("com.docker.compose.service", "").startswith(SERVICE_PREFIX)
        and (c.attrs.get("Config", {}).get("Cmd") or [None])[-1] == profile
    ]
    if not mine:
        services = sorted({c.labels.get("com.docker.compose.service", "?") for c in found})
        raise UsageError(
            "container",
            f"compose project {project}, service {SERVICE_PREFIX}*, profile {profile}",
            "no such container"
            + (f" (the project has: {', '.join(services)})" if services else " exists"),
            f"start it: `make up PROFILE={profile}` (or `make configure PROFILE={profile}` and "
            "`docker compose up -d` in compose/), or give the server log with LOG=FILE",
        )
    return sorted(mine, key=lambda c: c.labels.get("com.docker.compose.service", ""))


def published_ports(client: Any, project: str = PROJECT) -> set[int]:
    """The host ports the project's running containers publish (the vLLM service, or the router
    in front of the replicas)."""
    label = f"com.docker.compose.project={project}"
    ports: set[int] = set()
    for c in client.containers.list(filters={"label": label}):
        for bindings in (c.attrs.get("NetworkSettings", {}).get("Ports") or {}).values():
            ports.update(int(b["HostPort"]) for b in bindings or () if b.get("HostPort"))
    return ports


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serving_containers(client: Any, profile: str, url: str) -> list[Any]:
    """The service's vLLM containers when they are the server at `url`: a loopback URL whose
    port the compose project publishes. A server elsewhere (another host, a test double, a
    `vllm serve` by hand) is not theirs to describe: that is a usage error, as a missing
    container is in `find_service_containers`."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    ports = published_ports(client) if parts.hostname in LOOPBACK else set()
    if port not in ports:
        raise UsageError(
            "--url", url,
            f"is not a port compose project {PROJECT} publishes on this host"
            + (f" ({', '.join(map(str, sorted(ports)))})" if ports else ""),
            "point --url at the compose service (http://127.0.0.1:HOST_PORT) to read its "
            "containers",
        )  # fmt: skip
    return find_service_containers(client, profile)


@dataclass(frozen=True)
class Restarted:
    """On the line queue: the container was started again (its next lines are a new start)."""

    service: str | None


AUTOMATIC_RESTART = ("always", "unless-stopped")
"""Docker restart policies that start a container again after any exit."""
RESTART_POLL_S = 0.5
"""How often a reader looks whether a container Docker is restarting runs again."""


def restarting(state: dict[str, Any]) -> bool:
    """Docker's restart policy is bringing the container back (it will run again)."""
    return bool(state.get("Restarting")) or state.get("Status") == "restarting"


@dataclass
class _Reader:
    container: Any
    prefix: str
    """`service | ` when several containers share the parser (compose's own log format)."""
    service: str | None
    lines: queue.Queue[str | Restarted]

    def run(self) -> None:
        """Stream the log of each start, from the container's start; each line goes on the
        shared queue, and a `Restarted` between starts. Ends when the container stops for good
        (exited and not restarting) or is gone."""
        started = self._running_start(None)
        while started is not None:
            self._follow(started)
            started = self._running_start(started)
            if started is not None:
                self.lines.put(Restarted(self.service))

    def _running_start(self, previous: str | None) -> str | None:
        """The StartedAt of a start other than `previous` once the container runs it, waiting
        while Docker restarts it; None when it will not run again."""
        while True:
            try:
                self.container.reload()
            except engine_errors():
                return None
            state = self.container.attrs["State"]
            stamp = state.get("StartedAt")
            if (
                stamp != previous
                and not restarting(state)
                and (previous is None or state.get("Running"))
            ):
                return stamp
            if not restarting(state) and not state.get("Running"):
                return None
            time.sleep(RESTART_POLL_S)

    def _follow(self, started: str) -> None:
        pending = ""
        try:
            for chunk in self.container.logs(stream=True, follow=True, since=_epoch(started)):
                pending += chunk.decode("utf-8", "replace")
                *complete, pending = pending.split("\n")
                for line in complete:
                    self.lines.put(self.prefix + line)
        except engine_errors() as err:  # the engine went away mid-stream: failure() reports it
            self.lines.put(f"{self.prefix}(log stream ended: {type(err).__name__})")
        if pending:
            self.lines.put(self.prefix + pending)


DOCKER_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
"""How the Engine API stamps a log line (`docker logs --timestamps`): RFC 3339 in UTC."""


def _instant(stamp: str) -> dt.datetime:
    """Docker's RFC 3339 time (StartedAt, `docker logs -t`: up to nanoseconds, trailing zeros
    trimmed) as an aware datetime, to the microsecond."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    micros = int((frac + "000000")[:6]) if frac else 0
    return dt.datetime.fromisoformat(head).replace(microsecond=micros, tzinfo=dt.UTC)


def _epoch(stamp: str | None) -> int | None:
    """Docker's StartedAt as whole seconds since the epoch (None before the first start)."""
    if not stamp or stamp.startswith("0001-"):
        return None
    return int(_instant(stamp).timestamp())


@dataclass(frozen=True)
class Restarts:
    """What Docker's restart policy did to one container: how often it restarted it (the
    Engine API's RestartCount) and how the start before the current one ended."""

    container: str
    count: int
    cause: str | None
    """The previous start's root-cause line (vLLM's last error), None when it logged none."""

    def describe(self) -> str:
        if not self.count:
            return f"{self.container} never restarted"
        return (f"{self.container} restarted {self.count} time(s) by Docker; the start before "
                f"ended: {self.cause or NO_CAUSE}")  # fmt: skip


def lines_before(text: str, started: str) -> list[str]:
    """The lines of a `docker logs --timestamps` text logged before instant `started` (Docker's
    RFC 3339 time), without their timestamps."""
    cut = _instant(started)
    before: list[str] = []
    earlier = False
    for line in text.split("\n"):
        when, _, rest = line.partition(" ")
        stamp = DOCKER_TIME.fullmatch(when)
        if stamp is None:  # the tail of a line cut by a carriage return: the line's own side
            rest = line
        else:
            earlier = _instant(when) < cut
        if earlier and rest:
            before.append(rest)
    return before


def previous_start_lines(container: Any) -> list[str]:
    """The log lines of the starts before the container's current one (its log keeps every
    start; `docker logs --until` takes whole seconds, so lines are cut at StartedAt by their
    own timestamps)."""
    stamp = container.attrs["State"].get("StartedAt")
    if not stamp or not container.attrs.get("RestartCount"):
        return []
    until = int(_instant(stamp).timestamp()) + 1
    text = container.logs(stream=False, timestamps=True, until=until).decode("utf-8", "replace")
    return lines_before(text, stamp)


def root_cause(lines: list[str]) -> str | None:
    """The last error line of the last start in `lines` (what the parser keeps as a failed
    start's root cause), None when that start logged none."""
    parser = LogParser()
    for line in lines:
        parser.feed(line + "\n")
    facts = parser.result()
    last = [f for f in facts.failed_starts if f.start == facts.starts]
    return root_cause_of(last[-1].errors) if last else None


def restarts_of(container: Any) -> Restarts:
    """The container's restart count and, when it restarted, the previous start's cause."""
    count = int(container.attrs.get("RestartCount") or 0)
    return Restarts(container.name, count, root_cause(previous_start_lines(container)))


RSS_KEYS = ("anon", "total_rss", "rss")
"""A container's resident anonymous memory in the Engine API's `memory_stats.stats`: cgroup v2
names it `anon`, cgroup v1 `total_rss` (with its children) or `rss`; none counts the page
cache, which the kernel gives back and a weights load fills."""


def rss_of_stats(stats: dict[str, Any]) -> int | None:
    """The resident memory of one Engine API stats answer; None when it has none."""
    inner = (stats.get("memory_stats") or {}).get("stats") or {}
    return next((int(inner[key]) for key in RSS_KEYS if key in inner), None)


def containers_rss(containers: list[Any]) -> int | None:
    """The summed resident memory of the containers now (every process of the server:
    the API server, the engine core and its workers); None when one has none."""
    sizes = [rss_of_stats(c.stats(stream=False, one_shot=True)) for c in containers]
    return None if any(size is None for size in sizes) else sum(s for s in sizes if s is not None)


def logs_since_start(containers: list[Any]) -> list[str]:
    """What each container logged since its start, as lines (compose-prefixed when several)."""
    lines: list[str] = []
    for c in containers:
        since = _epoch(c.attrs["State"].get("StartedAt"))
        text = c.logs(stream=False, since=since).decode("utf-8", "replace")
        service = c.labels.get("com.docker.compose.service", c.name)
        prefix = f"{service}  | " if len(containers) > 1 else ""
        lines += [prefix + line + "\n" for line in text.split("\n") if line]
    return lines


class ContainerLogs:
    """Log source for the smoke check: the compose service's containers, read live."""

    def __init__(self, containers: list[Any], parser: LogParser) -> None:
        self.containers = containers
        self.parser = parser
        self.lines: queue.Queue[str | Restarted] = queue.Queue()
        for c in containers:
            service = c.labels.get("com.docker.compose.service", c.name)
            several = len(containers) > 1
            reader = _Reader(c, f"{service}  | " if several else "", service if several else None,
                             self.lines)  # fmt: skip
            threading.Thread(target=reader.run, name=f"logs-{c.name}", daemon=True).start()

    def describe(self) -> str:
        return ", ".join(c.name for c in self.containers)

    def poll(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            if isinstance(line, Restarted):
                self.parser.restarted(line.service)
            else:
                self.parser.feed(line + "\n")

    def failure(self) -> str | None:
        """Why a container can no longer become ready, or None while it still can."""
        for c in self.containers:
            try:
                c.reload()
            except engine_errors() as err:  # removed container, or the engine went away
                return f"{c.name} is gone ({type(err).__name__})"
            state = c.attrs["State"]
            status = state.get("Status")
            if restarting(state):
                continue  # Docker brings it back; its new start is followed
            if status in ("exited", "dead") or state.get("OOMKilled"):
                self.poll()
                return (
                    f"container {c.name} {status}, exit code {state.get('ExitCode')}"
                    f"{', OOM-killed' if state.get('OOMKilled') else ''}"
                )
        return None

    def status(self) -> str:
        """Each container's health status, for the progress line."""
        return ", ".join(
            f"{c.name} "
            + ("restarting" if restarting(c.attrs["State"])
               else (c.attrs["State"].get("Health") or {}).get("Status", "no healthcheck"))
            for c in self.containers
        )  # fmt: skip

    def restarts_automatically(self) -> bool:
        """Every container runs under a restart policy that starts it again whatever its exit
        code (the API server exits 0 after its engine died, so `on-failure` would not)."""
        return all(
            (c.attrs.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name")
            in AUTOMATIC_RESTART
            for c in self.containers
        )

    def restarts(self) -> list[Restarts]:
        """Each container's restarts as the Engine API reports them now."""
        for c in self.containers:
            c.reload()
        return [restarts_of(c) for c in self.containers]

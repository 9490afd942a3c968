"""The running service read through the Docker Engine API: its logs, health and exit state.

With no `--log`, the smoke check finds the compose project's vLLM container(s) running the
profile, follows each one's log from the container's start (not from now) into the same
streaming parser, and watches the container's state while it waits: a container that exits,
restarts or is OOM-killed ends the wait at once with its exit code and vLLM's root-cause line.
The Docker SDK negotiates the API version with the engine (`version="auto"`), so an older
engine works as well as a newer one.

Log lines arrive on one reader thread per container; `poll()` hands them to the parser on the
caller's thread, so the parser is only ever touched by one thread.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

from launch import docker_api
from launch.docker_api import ENGINE_ERRORS
from launch.errors import ProfileError
from smoke.logparse import LogParser

PROJECT = "glm53"
"""The compose project (`name:` in compose/compose.yaml)."""
SERVICE_PREFIX = "vllm"
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
        raise ProfileError(
            "container",
            f"compose project {project}, service {SERVICE_PREFIX}*, profile {profile}",
            "no such container"
            + (f" (the project has: {', '.join(services)})" if services else " exists"),
            f"start it: `make up PROFILE={profile}` (or `make configure PROFILE={profile}` and "
            "`docker compose up -d` in compose/), or give the server log with LOG=FILE",
        )
    return sorted(mine, key=lambda c: c.labels.get("com.docker.compose.service", ""))


@dataclass
class _Reader:
    container: Any
    prefix: str
    """`service | ` when several containers share the parser (compose's own log format)."""
    lines: queue.Queue[str]

    def run(self) -> None:
        """Stream the log from the container's start; each line goes on the shared queue."""
        since = _epoch(self.container.attrs["State"].get("StartedAt"))
        pending = ""
        try:
            for chunk in self.container.logs(stream=True, follow=True, since=since):
                pending += chunk.decode("utf-8", "replace")
                *complete, pending = pending.split("\n")
                for line in complete:
                    self.lines.put(self.prefix + line)
        except ENGINE_ERRORS as err:  # the engine went away mid-stream: failure() reports it
            self.lines.put(f"{self.prefix}(log stream ended: {type(err).__name__})")
        if pending:
            self.lines.put(self.prefix + pending)


def _epoch(stamp: str | None) -> int | None:
    """Docker's RFC 3339 StartedAt (nanoseconds) as whole seconds since the epoch."""
    import datetime as dt

    if not stamp or stamp.startswith("0001-"):
        return None
    head = stamp.split(".")[0].rstrip("Z")
    return int(dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC).timestamp())


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
        self.lines: queue.Queue[str] = queue.Queue()
        for c in containers:
            service = c.labels.get("com.docker.compose.service", c.name)
            prefix = f"{service}  | " if len(containers) > 1 else ""
            reader = _Reader(c, prefix, self.lines)
            threading.Thread(target=reader.run, name=f"logs-{c.name}", daemon=True).start()

    def describe(self) -> str:
        return ", ".join(c.name for c in self.containers)

    def poll(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            self.parser.feed(line + "\n")

    def failure(self) -> str | None:
        """Why a container can no longer become ready, or None while it still can."""
        for c in self.containers:
            try:
                c.reload()
            except ENGINE_ERRORS as err:  # removed container, or the engine went away
                return f"{c.name} is gone ({type(err).__name__})"
            state = c.attrs["State"]
            status = state.get("Status")
            if status in ("exited", "dead") or state.get("Restarting") or state.get("OOMKilled"):
                self.poll()
                return (
                    f"container {c.name} {status}, exit code {state.get('ExitCode')}"
                    f"{', OOM-killed' if state.get('OOMKilled') else ''}"
                )
        return None

    def status(self) -> str:
        """Each container's health status, for the progress line."""
        return ", ".join(
            f"{c.name} {(c.attrs['State'].get('Health') or {}).get('Status', 'no healthcheck')}"
            for c in self.containers
        )

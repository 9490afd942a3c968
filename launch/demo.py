"""`make demo`: from a fresh clone and a Docker engine to a served, smoke-checked `cpu-tiny`.

Each step makes what is missing and reuses what exists, so a second run is a check of a
running server: the Debian 12 base (from Debian's packages with mmdebstrap, as `make e2e` makes
it; where mmdebstrap is missing, the publisher's `debian:bookworm-slim` pinned by its digest),
the CPU image built from the Dockerfile and pinned as this engine's image ID (no registry), the
profile started with plain compose (`launch up`), its health, and `make smoke` (once per
container start: a later run on the same container says when it passed). The server is left
running; the end prints the time, a `curl` line and the commands that watch and stop it.
What a user would type runs as a subprocess (the build, `launch up`, `smoke check`), its output
shown as it comes.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from launch.compose_files import PROJECT, SERVICE
from launch.docker_api import connect, local_image_id
from launch.image_lock import (
    KIT_ROOT,
    PIN_KEYS,
    is_digest_ref,
    lock_path,
    read_lock,
    write_lock,
)
from launch.kit_cache import kit_cache_dir
from launch.settings import Settings

PROFILE = "cpu-tiny"
BASE_TAG = "glm53-kit/debian:bookworm"
"""The local tag of the Debian 12 base the demo makes (reused by a later run)."""
IMAGE_TAG = "glm53-kit-cpu:demo"
PUBLISHED_BASE = "debian:bookworm-slim"
"""The Debian project's own Debian 12 image, pinned by digest where mmdebstrap is missing."""
STATE_FILE = "demo.json"
POLL_S = 2.0
SHOW_EVERY_S = 15.0


class StepFailed(Exception):
    """A step of the demo failed: which one, what happened and what to do."""

    def __init__(self, step: str, what: str, fix: str) -> None:
        super().__init__(f"make demo: {step}: {what}. Fix: {fix}")


@dataclass(frozen=True)
class DemoOptions:
    build_args: tuple[str, ...] = ()
    """Passed to docker/build.py (e.g. --trust-host-ca behind a TLS-inspecting proxy)."""
    healthy_within_s: float = 600.0
    python: str = sys.executable


@dataclass
class Progress:
    """Numbered step lines with the time since the start."""

    total: int
    started: float = field(default_factory=time.monotonic)
    done: int = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, line: str) -> None:
        print(f"[demo {self.elapsed():6.1f} s] {line}", flush=True)

    def step(self, name: str) -> None:
        self.done += 1
        self.say(f"{self.done}/{self.total} {name}")


def run(argv: Sequence[str], step: str, fix: str) -> None:
    """A command a user could type, its output passed through; a failure names the step."""
    print(f"$ {shlex.join(argv)}", flush=True)
    code = subprocess.run(list(argv), cwd=KIT_ROOT, check=False).returncode
    if code != 0:
        raise StepFailed(step, f"`{shlex.join(argv[:4])} ...` exited {code}", fix)


def output_of(argv: Sequence[str], step: str, fix: str) -> str:
    done = subprocess.run(list(argv), cwd=KIT_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise StepFailed(step, f"`{shlex.join(argv[:4])} ...` exited {done.returncode}: {tail}",
                         fix)  # fmt: skip
    return done.stdout


def base_image(client: Any, options: DemoOptions, say: Callable[[str], None]) -> str | None:
    """The base the build uses: None when the lock pins one (the build reads it), else a local
    ID: the demo's earlier base, a new one from Debian's packages, or the publisher's pinned."""
    if read_lock().get(PIN_KEYS["cpu-base"]):
        say("base: CPU_BASE_IMAGE from the lock")
        return None
    if (found := local_image_id(client, BASE_TAG)) is not None:
        say(f"base: {BASE_TAG} from an earlier run ({found[:19]})")
        return found
    step = "make the Debian 12 base"
    if shutil.which("mmdebstrap"):
        say(f"base: {BASE_TAG} from Debian's packages (mmdebstrap, about 2 minutes)")
        out = output_of([options.python, "docker/debian_base.py", "--engine", "cpu", "--tag",
                         BASE_TAG], step, "check that deb.debian.org is reachable; "
                        "`python docker/debian_base.py --engine cpu --tag X` runs it alone")
        return out.strip().splitlines()[-1]
    say(f"base: no mmdebstrap here; pinning the publisher's {PUBLISHED_BASE} by digest")
    run([options.python, "-m", "launch", "pin", PUBLISHED_BASE, "--source", "cpu-base"], step,
        "install mmdebstrap (`apt-get install mmdebstrap`) to make the base from Debian's "
        "packages, or pin a Debian 12 base yourself (`make pin IMAGE=repo:tag "
        "SOURCE=cpu-base`)")  # fmt: skip
    return None


def cpu_image(client: Any, options: DemoOptions, progress: Progress) -> str:
    """The pinned CPU image when this engine has it (or compose can pull it), else one built
    from the Dockerfile and pinned as this engine's image ID."""
    key = PIN_KEYS["cpu"]
    pinned = read_lock().get(key, "")
    if pinned and local_image_id(client, pinned) is not None:
        progress.say(f"CPU image: {key}={pinned[:26]}... is on this engine, reused")
        return pinned
    if is_digest_ref(pinned):
        progress.say(f"CPU image: {key}={pinned}, compose pulls it")
        return pinned
    base = base_image(client, options, progress.say)
    progress.say(f"CPU image: building {IMAGE_TAG} from the Dockerfile (6-7 minutes on two "
                 "cores; the build's steps follow)")  # fmt: skip
    run([options.python, "docker/build.py", "--engine", "cpu", "--tag", IMAGE_TAG,
         *(["--base-id", base] if base else []), *options.build_args], "build the CPU image",
        "read the build's output above; `make build-cpu` runs the same build alone (behind a "
        "TLS-inspecting proxy: make demo BUILD_ARGS=--trust-host-ca)")  # fmt: skip
    image_id = local_image_id(client, IMAGE_TAG)
    if image_id is None:
        raise StepFailed("build the CPU image", f"the build left no {IMAGE_TAG}",
                         "run `make build-cpu` and read its output")  # fmt: skip
    write_lock({key: image_id})
    progress.say(f"CPU image: {key}={image_id} written to {lock_path()} (this engine's image "
                 "ID: compose runs it like a digest, no registry)")  # fmt: skip
    return image_id


def server_container(client: Any) -> Any | None:
    found = client.containers.list(all=True, filters={
        "label": [f"com.docker.compose.project={PROJECT}",
                  f"com.docker.compose.service={SERVICE}"]})  # fmt: skip
    return found[0] if found else None


def healthy_with(client: Any, image: str) -> Any | None:
    """The project's server when it is running, healthy and on `image`."""
    container = server_container(client)
    if container is None:
        return None
    state = container.attrs["State"]
    same = container.image.id == local_image_id(client, image)
    return container if same and (state.get("Health") or {}).get("Status") == "healthy" else None


def wait_healthy(client: Any, within: float, progress: Progress) -> Any:
    start = time.monotonic()
    shown = start
    while True:
        container = server_container(client)
        if container is not None:
            state = container.attrs["State"]
            health = (state.get("Health") or {}).get("Status")
            if health == "healthy":
                return container
            if state.get("Status") == "exited":
                tail = container.logs(tail=15).decode(errors="replace")
                raise StepFailed("wait for health", f"the server exited with code "
                                 f"{state.get('ExitCode')}:\n{tail}",
                                 "read `make logs`; `make down` clears it")  # fmt: skip
        if time.monotonic() - start > within:
            raise StepFailed("wait for health", f"not healthy within {within:.0f} s",
                             "read `make logs` (the model loads, then the health check passes)")
        if time.monotonic() - shown >= SHOW_EVERY_S:
            shown = time.monotonic()
            status = "no container yet" if container is None else \
                (container.attrs["State"].get("Health") or {}).get("Status", "?")  # fmt: skip
            progress.say(f"waiting for health ({status}, {shown - start:.0f} s)")
        time.sleep(POLL_S)


def smoke_passed(container: Any) -> str | None:
    """When `make smoke` passed on this very container start, from an earlier run."""
    path = kit_cache_dir() / STATE_FILE
    if not path.is_file():
        return None
    state = json.loads(path.read_text(encoding="utf-8"))
    started = container.attrs["State"].get("StartedAt")
    same = state.get("container") == container.id and state.get("started") == started
    return str(state.get("passed_at")) if same else None


def remember_smoke(container: Any) -> None:
    path = kit_cache_dir() / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"container": container.id,
                                "started": container.attrs["State"].get("StartedAt"),
                                "passed_at": time.strftime("%Y-%m-%d %H:%M:%S")}),
                    encoding="utf-8")  # fmt: skip


def curl_line(settings: Settings, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}],
                       "max_tokens": 32})  # fmt: skip
    argv = ["curl", "-s", f"{settings.url()}/v1/chat/completions", "-H",
            "Content-Type: application/json"]  # fmt: skip
    key = "" if settings.api_key() is None else (
        f' -H "Authorization: Bearer $(cat {shlex.quote(str(settings.api_key_file))})"')
    return f"{shlex.join(argv)}{key} -d {shlex.quote(body)}"


def demo(options: DemoOptions, settings: Settings, model: str) -> int:
    progress = Progress(total=5)
    progress.step("the Docker engine")
    client = connect("then run `make demo` again")
    progress.step("the CPU image")
    image = cpu_image(client, options, progress)
    progress.step(f"start {PROFILE} with plain compose")
    container = healthy_with(client, image)
    if container is not None:
        progress.say(f"{container.name} is already running and healthy on this image, reused")
    else:
        run([options.python, "-m", "launch", "up", PROFILE], "start the server",
            "read the error above; `make up PROFILE=cpu-tiny` runs it alone")  # fmt: skip
    progress.step("wait for health")
    if container is None:
        container = wait_healthy(client, options.healthy_within_s, progress)
    serving_after = progress.elapsed()
    progress.say(f"{container.name} is healthy")
    progress.step("make smoke")
    passed_at = smoke_passed(container)
    if passed_at is not None:
        progress.say(f"smoke passed on this container at {passed_at}; `make smoke "
                     f"PROFILE={PROFILE}` checks it again")  # fmt: skip
    else:
        run([options.python, "-m", "smoke", "check", "--profile", PROFILE], "make smoke",
            "the failed checks are named above (docs/smoke.md); the server stays up for "
            "`make logs`, `make down` stops it")  # fmt: skip
        remember_smoke(container)
    total = progress.elapsed()
    print(f"\nmake demo: {PROFILE} serving at {settings.url()} after {serving_after:.0f} s, "
          f"smoke passed, {total:.0f} s in all.\n"
          f"  try it:   {curl_line(settings, model)}\n"
          f"  watch it: make top PROFILE={PROFILE}\n"
          f"  check it: make smoke PROFILE={PROFILE}\n"
          f"  stop it:  make down", flush=True)  # fmt: skip
    if settings.api_key() is not None:
        print(f"  the API key is in {settings.api_key_file}", flush=True)
    return 0

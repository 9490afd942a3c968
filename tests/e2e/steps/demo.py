"""`make demo` as a new user types it on a fresh clone with a Docker engine: from nothing (no
base, no image, no pin) to a served cpu-tiny that passed `make smoke`, with the time printed;
a second `make demo` reuses all of it in seconds; the server it left running answers a chat
completion after `make demo` returned. The later steps take the image it built (its layers,
then the registry path) and the server it started."""

from __future__ import annotations

import re
import time

from launch.demo import BASE_TAG, IMAGE_TAG
from launch.image_lock import is_local_id
from tests.e2e.harness import HOST_PORT, Run, Step, StepFailed, chat, container, make

BUILD_ARGS = "BUILD_ARGS=--trust-host-ca --allow-dirty"
"""CI's own build arguments (the host's CA for its TLS-inspecting proxy; the e2e's lock copy)."""
SUMMARY = re.compile(r"make demo: cpu-tiny serving at \S+ after (?P<serving>\d+) s, smoke "
                     r"passed, (?P<total>\d+) s in all\.")  # fmt: skip
REUSED = ("is on this engine, reused", "is already running and healthy on this image, reused",
          "smoke passed on this container at")
"""What a second run says of the image, the server and the smoke it found."""


def run_demo(run: Run) -> tuple[str, re.Match[str], float]:
    start = time.monotonic()
    out = make(run, "demo", BUILD_ARGS, timeout=1800).stdout
    secs = time.monotonic() - start
    summary = SUMMARY.search(out)
    if summary is None:
        raise StepFailed(f"make demo printed no summary: {out.strip().splitlines()[-3:]}")
    return out, summary, secs


def from_nothing(run: Run) -> str:
    for key in ("CPU_IMAGE", "CPU_BASE_IMAGE"):
        if run.lock.get(key):
            raise StepFailed(f"not from nothing: {key}={run.lock[key]} is pinned already")
    out, summary, secs = run_demo(run)
    pinned = run.lock["CPU_IMAGE"]
    built = run.sh(["docker", "image", "inspect", "--format", "{{.Id}}", IMAGE_TAG]).stdout
    if not is_local_id(pinned) or pinned != built.strip():
        raise StepFailed(f"CPU_IMAGE={pinned}, the image make demo built is {built.strip()}")
    if "from Debian's packages" not in out:
        raise StepFailed("the base did not come from Debian's packages")
    run.state.images.update({"cpu": IMAGE_TAG, "cpu-base": BASE_TAG, "cpu-demo": pinned})
    run.state.demo_container = container_id(run)
    return (f"from nothing in {secs:.0f} s (make demo said: serving after "
            f"{summary.group('serving')} s, smoke passed, {summary.group('total')} s in all); "
            f"base {BASE_TAG} from Debian's packages, CPU_IMAGE={pinned[:19]}... (this "
            "engine's ID, no registry)")


def container_id(run: Run) -> str:
    return run.sh(["docker", "inspect", "--format", "{{.Id}}", container()]).stdout.strip()


def again(run: Run) -> str:
    out, summary, secs = run_demo(run)
    missing = [line for line in REUSED if line not in out]
    if missing or "docker/build.py" in out:
        raise StepFailed(f"the second run did not reuse everything: missing {missing}")
    if container_id(run) != run.state.demo_container:
        raise StepFailed("the second run started another server")
    return (f"reused the image, the running server and its smoke in {secs:.1f} s "
            f"(make demo said {summary.group('total')} s)")


def answers(run: Run) -> str:
    text = chat(f"http://127.0.0.1:{HOST_PORT}", "Hello!", max_tokens=24)
    if not text.strip():
        raise StepFailed("an empty answer")
    return f"after make demo returned, POST /v1/chat/completions answered {text.strip()[:60]!r}"


# The first step after the engine's: make demo itself names a missing engine.
DEMO = Step("make demo from nothing: base, CPU image, pin, compose up, healthy, smoke",
            from_nothing)
AGAIN = Step("make demo again: everything reused, in seconds", again, (DEMO,))
ANSWERS = Step("the server make demo left running answers a chat completion", answers, (DEMO,))

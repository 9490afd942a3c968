"""What goes wrong, on the real engine: a server killed while the smoke waits, a server started
with prefix caching off, a KV cache that cannot hold one request, and `make down` while
requests stream (they finish in the drain, nothing is left behind)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from launch.loader import load
from smoke.client import CheckFailed, RequestError, Server, first_choice, stream_chunks
from tests.e2e.harness import (
    HOST_PORT,
    PROFILE,
    PROJECT,
    Run,
    Step,
    StepFailed,
    container,
    kit_smoke,
    make,
    project_containers,
    read_verdict,
    serving,
    smoke_verdict,
    wait_healthy,
)
from tests.e2e.steps.access import EVERY_ROUTE
from tests.e2e.steps.images import PIN


def killed_mid_check(run: Run) -> str:
    serving(run)
    timeout = 240
    smoke = kit_smoke(run, "--timeout", str(timeout))
    time.sleep(8)
    run.sh(["docker", "kill", container()])
    killed = time.monotonic()
    out, _ = smoke.communicate(timeout=timeout + 30)
    after = time.monotonic() - killed
    verdict = read_verdict(out, smoke.returncode)
    failed = verdict.failed()
    if verdict.exit_code != 1 or not failed or failed[0]["key"] != "server-up":
        raise StepFailed(f"smoke exited {verdict.exit_code}, failed {failed[:1]}")
    if "exit code 137" not in failed[0]["seen"]:
        raise StepFailed(f"the verdict does not give the exit code: {failed[0]['seen']}")
    if after > 15:
        raise StepFailed(f"the wait went on {after:.0f} s after the kill ({timeout} s bound)")
    return f"'{failed[0]['name']}' failed {after:.0f} s after the kill: {failed[0]['seen'][:110]}"


def prefix_off(run: Run) -> str:
    """The server started with prefix caching off (as DCP > 1 silently did to users), the smoke
    run for the profile, which has it on: the prefix check must fail by name, with 0 hits."""
    serving(run, "ENABLE_PREFIX_CACHING=false")
    verdict = smoke_verdict(run, "--only", "prefix", "--timeout", "240")
    log = run.sh(["docker", "logs", container()]).stdout
    if "enable_prefix_caching=False" not in log:  # vLLM's own engine-config line
        raise StepFailed("the server's engine config does not show prefix caching off")
    prefix = verdict.checks.get("prefix") or {}
    if verdict.exit_code != 1 or prefix.get("ok") is not False or prefix.get("skipped"):
        raise StepFailed(f"smoke exited {verdict.exit_code}: {prefix}")
    if not prefix["seen"].startswith("0 of "):
        raise StepFailed(f"hits other than 0 with caching off: {prefix['seen']}")
    return f"'{prefix['name']}' FAIL: {prefix['seen'][:150]}"


def kv_does_not_fit(run: Run) -> str:
    # 1,048,576 tokens x 2,048 bytes = 2 GiB of KV cache for one request; the profile has 1 GiB
    serving(run, "MAX_MODEL_LEN=1048576")
    timeout = 240
    start = time.monotonic()
    verdict = smoke_verdict(run, "--timeout", str(timeout), timeout=timeout + 30)
    secs = time.monotonic() - start
    ready = verdict.checks["server-up"]
    if ready["ok"] or "ValueError: To serve at least one request" not in ready["seen"]:
        raise StepFailed(f"readiness: {ready}")
    if secs > timeout / 2:
        raise StepFailed(f"the wait took {secs:.0f} s of its {timeout} s; it should end at once")
    return f"wait ended after {secs:.0f} s: {ready['seen'][:150]}"


STREAMS = 4
STREAM_TOKENS = 384
"""Streams in flight when `make down` runs: four ignore-EOS streams of 384 tokens take the CPU
server about 12 s, inside cpu-tiny's drain (deployment.drain_s)."""


@dataclass
class Stream:
    """One streamed chat completion: tokens seen, how it ended, when."""

    tokens: int = 0
    finish: str | None = None
    error: str | None = None
    ended: float = 0.0


def stream(server: Server, out: Stream, started: threading.Event) -> None:
    """One ignore-EOS stream through the smoke's own client (which also fails a stream that
    ends without [DONE])."""
    body = {"messages": [{"role": "user", "content": "Count on."}],
            "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream": True}  # fmt: skip
    try:
        for chunk in stream_chunks(server, body):
            choice = first_choice(chunk)
            out.tokens += 1
            started.set()
            out.finish = choice.get("finish_reason") or out.finish
    except (CheckFailed, RequestError) as err:
        out.error = f"{type(err).__name__}: {str(err)[:80]}"
    finally:
        out.ended = time.monotonic()
        started.set()


def open_streams(server: Server, count: int) -> tuple[list[Stream], list[threading.Thread]]:
    """`count` ignore-EOS streams, each on its own thread, returned once each has its first
    chunk (or 60 s passed)."""
    streams = [Stream() for _ in range(count)]
    first = [threading.Event() for _ in streams]
    threads = [threading.Thread(target=stream, args=(server, s, e))
               for s, e in zip(streams, first, strict=True)]  # fmt: skip
    for thread in threads:
        thread.start()
    for event in first:
        event.wait(60)
    return streams, threads


def stopped_while_streaming(run: Run) -> str:
    """`make down` while requests stream to the server the access step left serving (one engine
    start for both), as users type it: the server gets SIGTERM, the
    requests in flight finish within the profile's drain (vLLM's --shutdown-timeout), the
    container exits on its own inside compose's stop grace period (the engine records no kill
    with signal 9 and the exit code is not 137), and nothing of the project is left."""
    key = run.state.api_key  # the server the access step started, still serving
    if key is None:
        raise StepFailed("no server with a key from the access step")
    wait_healthy(run, [container()])
    grace = load(PROFILE).profile.stop_grace_s
    server = Server(f"http://127.0.0.1:{HOST_PORT}", "kit-tiny-chat", key, timeout=60)
    streams, threads = open_streams(server, STREAMS)
    name = container()
    since = str(int(time.time()))
    stop = time.monotonic()
    make(run, "down", timeout=grace + 60)
    took = time.monotonic() - stop
    for thread in threads:
        thread.join(30)
    # `down` removes the container: how it ended is read from the engine's events meanwhile
    until = str(int(time.time()) + 1)
    events = [json.loads(line) for line in run.sh(
        ["docker", "events", "--since", since, "--until", until, "--filter", f"container={name}",
         "--format", "{{json .}}"]).stdout.splitlines()]  # fmt: skip
    signals = [e["Actor"]["Attributes"].get("signal") for e in events if e.get("Action") == "kill"]
    died = [e["Actor"]["Attributes"].get("exitCode") for e in events if e.get("Action") == "die"]
    unfinished = [vars(s) for s in streams if s.finish != "length" or s.error]
    hung = [thread.name for thread in threads if thread.is_alive()]
    left = project_containers(run)
    if hung:
        raise StepFailed(f"{len(hung)} stream(s) still open {took:.0f} s after `make down`")
    if unfinished:
        raise StepFailed(f"requests in flight did not finish in the drain: {unfinished}")
    if took > grace:
        raise StepFailed(f"`make down` took {took:.0f} s, past the {grace} s stop grace period")
    if left:
        raise StepFailed(f"{len(left)} container(s) of project {PROJECT} remain")
    if "9" in signals or len(died) != 1 or died[0] == "137":
        raise StepFailed(f"the server did not exit on its own: signals {signals}, exit {died}")
    ends = [round(s.ended - stop, 1) for s in streams]
    return (f"{STREAMS} streams of {STREAM_TOKENS} tokens in flight finished (finish_reason "
            f"length) {ends} s after `make down`, which returned after {took:.0f} s of its {grace} "
            f"s grace; signals {signals}, exit code {died[0]}; no container of project {PROJECT} "
            "remains")


KILLED_MID_CHECK = Step("server killed during the smoke wait", killed_mid_check, (PIN,))
PREFIX_OFF = Step("prefix caching off fails the prefix check", prefix_off, (PIN,))
KV_DOES_NOT_FIT = Step("KV cache that cannot fit ends the wait", kv_does_not_fit, (PIN,))
DOWN = Step("make down while requests stream: they finish, nothing is left",
            stopped_while_streaming, (EVERY_ROUTE,))  # fmt: skip

"""The e2e lane's harness: typed run state, steps that name the steps they need, and the few
things every step does (run a command as a user types it, plain `docker compose` in compose/,
wait for health, start a configuration, run the smoke check and read its JSON verdict).

A step returns the line the run prints, or raises `StepFailed` with it; a step whose
prerequisite failed is counted as failed (not run), never skipped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from launch.compose_env import DEFAULT_ENV_PATH  # noqa: E402
from launch.compose_files import PROJECT, SERVICE  # noqa: E402
from launch.image_lock import COMPOSE_DIR, LOCK_VAR, read_lock, write_lock  # noqa: E402
from smoke.client import RequestError  # noqa: E402
from smoke.containers import restarting  # noqa: E402
from smoke.metrics import FINISHED, parse_counter  # noqa: E402

ENV_PATH = DEFAULT_ENV_PATH
"""The lane runs what users type: plain `docker compose` in compose/ reads compose/.env."""
PROFILE = "cpu-tiny"
REGISTRY = os.environ.get("E2E_REGISTRY", "127.0.0.1:5000")
HOST_PORT = 8000
HEALTHY_WITHIN_S = 300
HF_CACHE_VOLUME = "glm53-e2e-hf-cache"
"""The weights volume of the run (compose's HF_CACHE_VOLUME), so a machine's own weights volume
is neither read nor removed by `down --volumes`."""
KIT_PYTHON = REPO / ".venv-kit" / "bin" / "python"
TEST_PYTHON = REPO / ".venv" / "bin" / "python"


class StepFailed(Exception):
    """A step's own failure; the message is the line the run prints."""


def container(replica: int | None = None) -> str:
    """The name compose gives the vLLM container (of replica `replica` behind the router)."""
    service = SERVICE if replica is None else f"{SERVICE}-{replica}"
    return f"{PROJECT}-{service}-1"


@dataclass
class RunState:
    """What steps hand to later steps."""

    volumes_before: set[str] = field(default_factory=set)
    images: dict[str, str] = field(default_factory=dict)
    """What the image lanes made: name -> reference (tags, the pinned digest, the local ID)."""
    api_key: str | None = None
    """The key the running server was started with (the access step leaves it serving)."""
    demo_container: str | None = None
    """The ID of the server `make demo` started (a second run must keep it)."""

    def image(self, name: str) -> str:
        if name not in self.images:
            raise StepFailed(f"no {name} image from an earlier step")
        return self.images[name]


@dataclass(frozen=True)
class Step:
    name: str
    body: Callable[[Run], str]
    needs: tuple[Step, ...] = ()


@dataclass
class Run:
    work: Path
    env: dict[str, str]
    state: RunState = field(default_factory=RunState)
    results: dict[str, tuple[bool, str, float]] = field(default_factory=dict)
    log_lock: threading.Lock = field(default_factory=threading.Lock)
    """commands.log is written by a lane running beside the main one too (`Beside`)."""

    @property
    def lock(self) -> dict[str, str]:
        return read_lock(Path(self.env["KIT_IMAGES_LOCK"]))

    def sh(self, argv: list[str], *, cwd: Path = REPO, timeout: float = 900, check: bool = True,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run a command, keep its output in the work directory, fail the step on error."""
        result = subprocess.run(argv, cwd=cwd, env={**self.env, **(env or {})}, text=True,
                                capture_output=True, timeout=timeout, check=False)  # fmt: skip
        with self.log_lock, (self.work / "commands.log").open("a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(argv)}  (cwd {cwd}, exit {result.returncode})\n")
            fh.write(result.stdout + result.stderr + "\n")
        if check and result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise StepFailed(f"`{' '.join(argv[:4])}` exited {result.returncode}: "
                             f"{' | '.join(tail)}")  # fmt: skip
        return result

    def step(self, step: Step) -> bool:
        start = time.monotonic()
        missing = [s.name for s in step.needs if not self.results.get(s.name, (False,))[0]]
        if missing:
            ok, detail = False, f"not run: needs {', '.join(missing)}"
        else:
            try:
                ok, detail = True, step.body(self)
            except StepFailed as err:
                ok, detail = False, str(err)
            except (subprocess.TimeoutExpired, requests.RequestException, RequestError,
                    OSError) as err:
                ok, detail = False, f"{type(err).__name__}: {err}"
            except Exception as err:  # a defect in the step itself still ends in its FAIL line
                ok, detail = False, f"step crashed: {type(err).__name__}: {err}"
        secs = time.monotonic() - start
        self.results[step.name] = (ok, detail, secs)
        print(f"{'PASS' if ok else 'FAIL'} {step.name}: {detail} ({secs:.0f} s)", flush=True)
        return ok


@dataclass
class Beside:
    """Steps that run in a thread beside the main lane, in their own order: the CUDA image lane
    builds while the CPU image builds (each waits mostly on downloads and keeps one core busy),
    so a run pays for the longer of the two instead of both. Its steps touch no file the main
    lane writes: they pin into their own copy of the image lock, which `join` carries over.
    Each step prints its line when it ends, as the main lane's do; `join` (a step of the main
    lane) waits for the last one and hands the results and pins to the main run."""

    steps: tuple[Step, ...]
    child: Run | None = None
    thread: threading.Thread | None = None
    started_with: dict[str, str] = field(default_factory=dict)
    """The lock as the lane got it: what it pins is what differs from this at the join (the
    main lane pins meanwhile too, and those pins must stay)."""

    def start(self, run: Run) -> str:
        lock = run.work / "images.beside.lock"
        shutil.copy2(run.env[LOCK_VAR], lock)
        self.started_with = read_lock(lock)
        # what the main lane has done so far counts for the lane's own `needs`
        self.child = Run(run.work, {**run.env, LOCK_VAR: str(lock)}, run.state,
                         dict(run.results), log_lock=run.log_lock)  # fmt: skip
        child = self.child

        def lane() -> None:
            for step in self.steps:
                child.step(step)

        self.thread = threading.Thread(target=lane, name="beside", daemon=True)
        self.thread.start()
        return "started: " + "; ".join(step.name for step in self.steps)

    def join(self, run: Run) -> str:
        if self.thread is None or self.child is None:
            raise StepFailed("the lane beside was never started")
        start = time.monotonic()
        self.thread.join()
        mine = {s.name: self.child.results[s.name] for s in self.steps}
        run.results.update(mine)
        pins = {k: v for k, v in self.child.lock.items() if self.started_with.get(k) != v}
        if pins:
            write_lock(pins, Path(run.env[LOCK_VAR]))
        passed = sum(ok for ok, _, _ in mine.values())
        return (f"{passed} of {len(self.steps)} passed, waited {time.monotonic() - start:.0f} s; "
                f"pinned {', '.join(sorted(pins)) or 'nothing'}")


def compose(run: Run, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Plain `docker compose ...` in compose/, as users type it (it reads compose/.env)."""
    return run.sh(["docker", "compose", *args], cwd=COMPOSE_DIR, timeout=timeout)


def compose_down(run: Run) -> None:
    """`docker compose down` of whatever compose/.env runs (nothing before the first configure)."""
    if ENV_PATH.exists():
        compose(run, "down")


def make(run: Run, *args: str, timeout: float = 900, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return run.sh(["make", "--no-print-directory", *args], timeout=timeout, env=env, check=check)


def image_present(run: Run, ref: str) -> bool:
    return run.sh(["docker", "image", "inspect", ref], check=False).returncode == 0


def container_state(run: Run, name: str) -> dict[str, Any]:
    out = run.sh(["docker", "inspect", "--format", "{{json .State}}", name], check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def wait_for(what: str, ready: Callable[[], bool], within: float) -> float:
    """Seconds until `ready()` holds, asked each second; StepFailed naming `what` after
    `within` s."""
    start = time.monotonic()
    while not ready():
        if time.monotonic() - start > within:
            raise StepFailed(f"{what} not within {within:.0f} s")
        time.sleep(1)
    return time.monotonic() - start


def wait_answering(url: str, what: str, within: float) -> float:
    """Seconds until GET `url` answers 2xx."""

    def answers() -> bool:
        try:
            return requests.get(url, timeout=2).ok
        except requests.RequestException:
            return False

    return wait_for(f"{what} answering {url}", answers, within)


def wait_healthy(run: Run, names: list[str], within: float = HEALTHY_WITHIN_S) -> float:
    start = time.monotonic()
    while True:
        states = {n: container_state(run, n) for n in names}
        health = {n: (s.get("Health") or {}).get("Status") for n, s in states.items()}
        if all(h == "healthy" for h in health.values()):
            return time.monotonic() - start
        dead = [n for n, s in states.items() if s and not s.get("Running") and not restarting(s)]
        if dead:
            raise StepFailed(f"{dead[0]} exited with code {states[dead[0]].get('ExitCode')}")
        if time.monotonic() - start > within:
            raise StepFailed(f"not healthy within {within:.0f} s: {health}")
        time.sleep(2)


@contextmanager
def user_settings(*lines: str) -> Iterator[None]:
    """Lines in compose/.env above the generated block, as a user would add them; afterwards
    exactly those lines are taken out again, and what `configure` wrote meanwhile stays (the
    next `docker compose down` must find the files that are running)."""
    added = "".join(f"{line}\n" for line in lines)
    text = ENV_PATH.read_text(encoding="utf-8") if ENV_PATH.exists() else ""
    ENV_PATH.write_text(added + text, encoding="utf-8")
    try:
        yield
    finally:
        now = ENV_PATH.read_text(encoding="utf-8")
        if not now.startswith(added):
            raise StepFailed(f"compose/.env lost the lines the step added: {lines}")
        ENV_PATH.write_text(now[len(added):], encoding="utf-8")


def serving(run: Run, *settings: str, replicas: int | None = None) -> None:
    """What a user does to (re)start the CPU profile with `settings` in compose/.env: compose
    down, `make configure`, plain `docker compose up -d` (not waiting for health)."""
    compose_down(run)
    with user_settings(*settings):
        make(run, "configure", f"PROFILE={PROFILE}", *([f"REPLICAS={replicas}"] if replicas
                                                       else []))  # fmt: skip
        compose(run, "up", "--detach")


def kit_smoke(run: Run, *args: str) -> subprocess.Popen[str]:
    """`python -m smoke check` reading the service's containers, verdict as JSON (started)."""
    argv = [str(KIT_PYTHON), "-m", "smoke", "check", "--profile", PROFILE, "--json", *args]
    return subprocess.Popen(argv, cwd=REPO, env=run.env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """The smoke's JSON verdict, checks by key."""

    exit_code: int
    checks: dict[str, dict[str, Any]]

    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.checks.values() if not c["ok"] and not c["skipped"]]

    def passed(self, key: str) -> bool:
        return bool(self.checks.get(key, {}).get("ok"))


def read_verdict(out: str, exit_code: int) -> Verdict:
    """The JSON verdict in a smoke run's standard output (make echoes its command first)."""
    start = out.find("\n{") + 1 if not out.startswith("{") else 0
    try:
        checks = json.loads(out[start:])["checks"]
    except (ValueError, KeyError) as err:
        raise StepFailed(f"smoke exited {exit_code} without a JSON verdict: "
                         f"{out[-200:]!r}") from err  # fmt: skip
    return Verdict(exit_code, {c["key"]: c for c in checks})


def smoke_verdict(run: Run, *args: str, timeout: float = 600) -> Verdict:
    """Run the smoke check to its end and read its verdict."""
    proc = kit_smoke(run, *args)
    out, _ = proc.communicate(timeout=timeout)
    return read_verdict(out, proc.returncode)


def chat(url: str, prompt: str, max_tokens: int = 16, *, ignore_eos: bool = False,
         timeout: float = 30, api_key: str | None = None) -> str:  # fmt: skip
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    r = requests.post(f"{url}/v1/chat/completions", timeout=timeout, headers=headers, json={
        "model": "kit-tiny-chat", "messages": [{"role": "user", "content": prompt}],
        "temperature": 0, "max_tokens": max_tokens, "ignore_eos": ignore_eos,
    })  # fmt: skip
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def served_requests(port: int) -> float:
    """`vllm:request_success_total` of one replica, summed over finish reasons."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return parse_counter(text, FINISHED) or 0.0


def volumes(run: Run) -> set[str]:
    return set(run.sh(["docker", "volume", "ls", "--quiet"]).stdout.split())


def project_containers(run: Run) -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return run.sh(["docker", "ps", "--all", "--quiet", "--filter", label]).stdout.split()

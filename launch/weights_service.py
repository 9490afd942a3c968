"""Asking compose's `fetch` service (the profile's own image, with the weights volume) about a
profile's weights: download them, or check they are there and verified. What `launch fetch` runs
and what `launch up` asks first."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

from launch.compose_config import Configured
from launch.compose_env import compose_env_args
from launch.docker_api import docker_path
from launch.image_lock import COMPOSE_DIR
from launch.weights import MISSING_EXIT, NOT_FETCHED, WeightRepo, weight_repos

SERVICE = "fetch"
QUESTIONS = ("check", "verify")
"""`launch.weights` actions that only answer (sizes; sizes and digests): their output is read."""


def weights_argv(action: str, repos: list[WeightRepo]) -> list[str]:
    """`docker compose run` of the fetch service for `repos` (-T: no TTY for a check, so its
    output can be read; a download keeps the TTY for huggingface_hub's progress bars)."""
    tty = ["-T"] if action in QUESTIONS else []
    return ["docker", "compose", *compose_env_args(), "run", "--rm", *tty, SERVICE, action,
            *(r.spec for r in repos)]  # fmt: skip


@dataclass(frozen=True)
class WeightsCheck:
    """The fetch service's answer: what it reports missing, or why it could not answer (a
    check that did not run is never taken as weights present, nor as weights missing)."""

    missing: str | None = None
    unchecked: str | None = None


def weights_check(result: Configured, repos: list[WeightRepo],
                  action: str = "check") -> WeightsCheck:  # fmt: skip
    """Ask the fetch service (the profile's image) whether `repos` are fetched and verified
    (`verify`: and every byte still has its recorded digest). compose/.env must already hold
    `result`. Missing means the check itself said so: compose also exits 1 when it cannot pull
    the image or start the container."""
    argv = weights_argv(action, repos)
    argv[0] = docker_path()
    done = subprocess.run(argv, cwd=COMPOSE_DIR, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return WeightsCheck()
    said = [line for line in done.stdout.splitlines() if line.startswith(NOT_FETCHED)]
    if done.returncode == MISSING_EXIT and said:
        return WeightsCheck(missing="\n".join(said))
    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:]) or "no output"
    return WeightsCheck(unchecked=f"the weights check could not run (exit {done.returncode}): "
                                  f"{tail}")  # fmt: skip


def warn_if_missing(result: Configured) -> None:
    """`launch up`'s question before compose starts: a start that has to download the weights
    spends the health check's start period doing it. What could not be asked is said as such."""
    repos = weight_repos(result.plan.profile)
    if not repos:
        return
    state = weights_check(result, repos)
    name = result.plan.profile.name
    if state.unchecked is not None:
        print(f"warning: {state.unchecked}\nwarning: whether the weights are fetched was not "
              f"checked; `make fetch PROFILE={name} CHECK=1` asks again",
              file=sys.stderr, flush=True)  # fmt: skip
    elif state.missing is not None:
        print(f"warning: {state.missing}\nwarning: the server will download them itself, inside "
              f"the health check's start period; `make fetch PROFILE={name}` first avoids that",
              file=sys.stderr, flush=True)  # fmt: skip

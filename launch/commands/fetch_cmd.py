"""`python -m launch fetch PROFILE`: the profile's weights into the cache volume, before `up`.

The profile is validated and compose/.env written as `launch configure` does (bad input exits 2
before Docker is touched); then compose's `fetch` service, the profile's own image with the
`glm53-hf-cache` volume, runs `python -m launch.weights download` for the model and the draft
at their pinned revisions. `--check` asks the same service whether they are there and verified
(what `launch up` asks first); `--dry-run` prints the command only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass

from launch.commands.common import add_profile_arguments
from launch.commands.configure_cmd import (
    Configured,
    configure,
    plan_for_compose,
    prepare_compose,
)
from launch.docker_api import docker_path
from launch.image_lock import COMPOSE_DIR
from launch.weights import MISSING_EXIT, NOT_FETCHED, WeightRepo, weight_repos

NAME = "fetch"
SERVICE = "fetch"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="download a profile's weights into the cache volume")
    add_profile_arguments(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="only report whether the weights are fetched and verified (exit 1 if not)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the compose command only")
    # `configure` reads these; a fetch never starts replicas
    parser.set_defaults(gpu_sets=None, replicas=None)
    return parser


def weights_argv(action: str, repos: list[WeightRepo]) -> list[str]:
    """`docker compose run` of the fetch service for `repos` (-T: no TTY for a check, so its
    output can be read; a download keeps the TTY for huggingface_hub's progress bars)."""
    tty = ["-T"] if action == "check" else []
    return ["docker", "compose", "run", "--rm", *tty, SERVICE, action, *(r.spec for r in repos)]


@dataclass(frozen=True)
class WeightsCheck:
    """The fetch service's answer: what it reports missing, or why it could not answer (a
    check that did not run is never taken as weights present, nor as weights missing)."""

    missing: str | None = None
    unchecked: str | None = None


def weights_check(result: Configured, repos: list[WeightRepo]) -> WeightsCheck:
    """Ask the fetch service (the profile's image) whether `repos` are fetched and verified.
    compose/.env must already hold `result`. Missing means the check itself said so: compose
    also exits 1 when it cannot pull the image or start the container."""
    argv = weights_argv("check", repos)
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


def state_exit(state: WeightsCheck) -> int:
    """`--check`'s exit: 0 fetched, 1 missing, 2 when the check could not run."""
    return 2 if state.unchecked else MISSING_EXIT if state.missing else 0


def run(args: argparse.Namespace) -> int:
    plan = plan_for_compose(args, os.environ)
    repos = weight_repos(plan.profile)
    if not repos:
        print(f"profile {plan.profile.name} serves {plan.profile.engine.model}, a directory in "
              "its image: nothing to fetch")  # fmt: skip
        return 0
    result = configure(args, os.environ, plan)
    action = "check" if args.check else "download"
    argv = weights_argv(action, repos)
    print(f"cd {shlex.quote(str(COMPOSE_DIR))} && {shlex.join(argv)}", flush=True)
    if args.dry_run:
        return 0
    argv[0] = prepare_compose(result)
    if args.check:
        state = weights_check(result, repos)
        if state.unchecked is not None:
            print(f"error: {state.unchecked}", file=sys.stderr)
            return state_exit(state)
        print(state.missing or f"fetched and verified: {', '.join(r.spec for r in repos)}")
        return state_exit(state)
    return subprocess.run(argv, cwd=COMPOSE_DIR, check=False).returncode

"""`python -m launch fetch PROFILE`: the profile's weights into the cache volume, before `up`.

The profile is validated and compose/.env written as `launch configure` does (bad input exits 2
before Docker is touched); then compose's `fetch` service, the profile's own image with the
`glm53-hf-cache` volume, runs `python -m launch.weights download` for the model and the draft
at their pinned revisions. `--check` asks the same service whether they are there and verified
(what `launch up` asks first); `--dry-run` prints the command only.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

from launch.commands.common import add_profile_arguments
from launch.compose_config import configure, prepare_compose
from launch.image_lock import COMPOSE_DIR
from launch.plan import plan_for
from launch.settings import read_settings
from launch.weights import MISSING_EXIT, weight_repos
from launch.weights_service import WeightsCheck, weights_argv, weights_check

NAME = "fetch"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="download a profile's weights into the cache volume")
    add_profile_arguments(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="only report whether the weights are fetched and every byte still has the digest "
        "verified against the Hub (reads every file; exit 1 if not)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the compose command only")
    return parser


def state_exit(state: WeightsCheck) -> int:
    """`--check`'s exit: 0 fetched, 1 missing, 2 when the check could not run."""
    return 2 if state.unchecked else MISSING_EXIT if state.missing else 0


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args.sets)
    plan = plan_for(settings, args.profile)
    repos = weight_repos(plan.profile)
    if not repos:
        print(f"profile {plan.profile.name} serves {plan.profile.engine.model}, a directory in "
              "its image: nothing to fetch")  # fmt: skip
        return 0
    result = configure(plan, settings)
    action = "verify" if args.check else "download"
    argv = weights_argv(action, repos)
    print(f"cd {shlex.quote(str(COMPOSE_DIR))} && {shlex.join(argv)}", flush=True)
    if args.dry_run:
        return 0
    argv[0] = prepare_compose(result)
    if args.check:
        state = weights_check(result, repos, action)
        if state.unchecked is not None:
            print(f"error: {state.unchecked}", file=sys.stderr)
            return state_exit(state)
        print(state.missing or f"fetched and verified: {', '.join(r.spec for r in repos)}")
        return state_exit(state)
    return subprocess.run(argv, cwd=COMPOSE_DIR, check=False).returncode

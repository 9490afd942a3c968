"""`python -m launch up PROFILE`: configure compose/.env, then `docker compose up --detach`.

The profile is validated and compose/.env written first (`launch configure`: bad input exits 2
before Docker is touched); compose then runs in compose/ exactly as a user's plain
`docker compose up -d` would, reading the same .env. Before any of it, the KV cache the start
will get is predicted (`make capacity`'s answer, from its cache or the image when this host has
it): a configuration the engine would refuse exits 2 with both fixes. `--config` prints
compose's resolved configuration instead of starting; `--dry-run` prints what would be written
and run. Before
starting, it asks whether the profile's weights are fetched (`launch fetch --check`) and says so
when they are not: the server would spend its health check's start period downloading them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from capacity.host import NotPredicted, predict_start
from capacity.report import refusal
from launch.commands.common import add_profile_arguments, add_replica_arguments
from launch.compose_config import configure, prepare_compose, show
from launch.compose_env import compose_env_args
from launch.docker_api import nvidia_runtime
from launch.image_lock import COMPOSE_DIR, resolve_image
from launch.kv_offload import read_host_memory
from launch.plan import Plan, format_plan, plan_for
from launch.settings import Settings, read_settings
from launch.validate import check_host_memory
from launch.weights_service import warn_if_missing

NAME = "up"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="start a profile with docker compose")
    add_profile_arguments(parser)
    add_replica_arguments(parser)
    parser.add_argument(
        "--config",
        action="store_true",
        help="print the resolved compose configuration instead of starting",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the compose command only")
    return parser


def check_capacity(plan: Plan, settings: Settings, dry_run: bool = False) -> None:
    """The predicted KV cache (`capacity.host`): a start the engine would refuse exits 2 here
    with both fixes, before compose/.env is written or compose runs; a cache that holds fewer
    than max_num_seqs requests is a warning; no prediction is said, and the start goes on. A
    dry run asks the cache only: it says what it would ask when no answer is cached, and starts
    no container."""
    image = resolve_image(plan.profile.deployment.image, settings.merged)
    try:
        predicted = predict_start(plan, image, cached_only=dry_run)
    except NotPredicted as why:
        print(f"capacity: not predicted: {why}", file=sys.stderr, flush=True)
        return
    print(predicted.summary(), flush=True)
    refused = refusal(predicted.answer, predicted.budgets)
    if refused is not None:
        raise refused
    if (warning := predicted.short_warning()) is not None:
        print(warning, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args.sets)
    plan = plan_for(settings, args.profile)
    check_capacity(plan, settings, dry_run=args.dry_run)
    result = configure(plan, settings, args.gpu_sets, args.replicas,
                       monitoring=args.monitoring,
                       gpu_exporter=args.monitoring and nvidia_runtime())
    check_host_memory(result.plan.profile, read_host_memory())
    argv = ["docker", "compose", *compose_env_args(),
            *(["config"] if args.config else ["up", "--detach"])]  # fmt: skip
    print(format_plan(result.plan))
    print(show(result))
    print(f"cd {shlex.quote(str(COMPOSE_DIR))} && {shlex.join(argv)}", flush=True)
    if args.dry_run:
        return 0
    docker = prepare_compose(result)
    if not args.config:
        warn_if_missing(result)
    os.chdir(COMPOSE_DIR)
    os.execv(docker, argv)
    return 0  # pragma: no cover - execv does not return

"""`python -m launch configure PROFILE`: write what compose needs into compose/.env.

The profile is loaded and validated with the user's settings in compose/.env and the
environment (bad input exits 2 and nothing is written); the image comes from compose/images.lock
by digest (a lock without one refuses, naming `make pin`). The result is the block after the
marker in compose/.env: PROFILE, IMAGE, SHM_SIZE, HEALTH_START_PERIOD and COMPOSE_FILE (the
compose files for the profile's device, or the generated replicas file), so plain
`docker compose up` / `down` / `logs` in compose/ run exactly this profile.
"""

from __future__ import annotations

import argparse

from launch.commands.common import add_profile_arguments, add_replica_arguments
from launch.compose_config import configure, show, write
from launch.compose_env import env_path
from launch.docker_api import nvidia_runtime
from launch.image_lock import COMPOSE_DIR
from launch.plan import plan_for
from launch.settings import read_settings

NAME = "configure"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="write compose/.env for a profile")
    add_profile_arguments(parser)
    add_replica_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    return parser


def run(args: argparse.Namespace) -> int:
    settings = read_settings(args.sets)
    result = configure(plan_for(settings, args.profile), settings, args.gpu_sets, args.replicas,
                       monitoring=args.monitoring,
                       gpu_exporter=args.monitoring and nvidia_runtime())
    print(show(result))
    if not args.dry_run:
        write(result)
        print(f"# written to {env_path()}; start with `docker compose up -d` in {COMPOSE_DIR}")
    return 0

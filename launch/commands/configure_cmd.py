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
import os

from launch.commands.common import add_profile_arguments, add_replica_arguments, compose_plan
from launch.compose_config import configure, show, write
from launch.compose_env import ENV_PATH
from launch.image_lock import COMPOSE_DIR

NAME = "configure"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="write compose/.env for a profile")
    add_profile_arguments(parser)
    add_replica_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    return parser


def run(args: argparse.Namespace) -> int:
    result = configure(compose_plan(args), os.environ, args.gpu_sets, args.replicas)
    print(show(result))
    if not args.dry_run:
        write(result)
        print(f"# written to {ENV_PATH}; start with `docker compose up -d` in {COMPOSE_DIR}")
    return 0

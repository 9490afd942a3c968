"""`python -m launch up PROFILE`: validate, resolve the image digest, exec `docker compose up`.

The profile is loaded and validated first (bad input exits 2 before Docker is touched), the
image comes from compose/images.lock by digest (a lock without one refuses), and compose gets
PROFILE and IMAGE in its environment. `--config` prints compose's resolved configuration instead.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil

from launch.commands.common import add_profile_arguments, plan_from_args
from launch.errors import ProfileError
from launch.image_lock import LOCK_PATH, resolve_image

NAME = "up"
COMPOSE_FILE = LOCK_PATH.parent / "compose.yaml"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="start a profile with docker compose")
    add_profile_arguments(parser)
    parser.add_argument(
        "--config",
        action="store_true",
        help="print the resolved compose configuration instead of starting",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the compose command only")
    return parser


def compose_argv(*, config: bool) -> list[str]:
    action = ["config"] if config else ["up", "--detach"]
    return ["docker", "compose", "-f", str(COMPOSE_FILE), *action]


def run(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    image = resolve_image(plan.profile.deployment.image, os.environ)
    argv = compose_argv(config=args.config)
    print(f"PROFILE={plan.profile.name} IMAGE={image} {shlex.join(argv)}", flush=True)
    if args.dry_run:
        return 0
    docker = shutil.which("docker")
    if docker is None:
        raise ProfileError(
            "docker", None, "is not on PATH", "install Docker with the compose plugin"
        )
    os.execve(docker, argv, {**os.environ, "PROFILE": plan.profile.name, "IMAGE": image})
    return 0  # pragma: no cover - execve does not return

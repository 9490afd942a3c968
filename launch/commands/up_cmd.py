"""`python -m launch up PROFILE`: validate, resolve image digests, exec `docker compose up`.

The profile is loaded and validated first (bad input exits 2 before Docker is touched), with
compose/.env applied as the container will see it; the image comes from compose/images.lock by
digest (a lock without one refuses). Compose gets PROFILE, IMAGE and the profile's shared-memory
size and start-up budget in its environment. With `--gpu-sets "0,1,2,3 4,5,6,7"` one replica
runs per set behind vLLM's router (compose/replicas.generated.yaml, rendered from the base file).
`--config` prints compose's resolved configuration instead of starting.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil

import yaml

from launch.commands.common import add_profile_arguments, build_plan, profile_name
from launch.commands.render_cmd import compose_document
from launch.errors import ProfileError
from launch.image_lock import COMPOSE_DIR, COMPOSE_FILE, read_lock, resolve_image
from launch.scale import replica_runtime_env

NAME = "up"
REPLICAS_FILE = COMPOSE_DIR / "replicas.generated.yaml"
USER_ENV = COMPOSE_DIR / ".env"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="start a profile with docker compose")
    add_profile_arguments(parser)
    parser.add_argument(
        "--gpu-sets",
        default=os.environ.get("GPU_SETS"),
        help='one replica per set behind the router, e.g. "0,1,2,3 4,5,6,7"',
    )
    parser.add_argument(
        "--config",
        action="store_true",
        help="print the resolved compose configuration instead of starting",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the compose command only")
    return parser


def run(args: argparse.Namespace) -> int:
    environ = {**(read_lock(USER_ENV) if USER_ENV.is_file() else {}), **os.environ}
    plan = build_plan(profile_name(args, environ), args.sets, environ, None)
    env = {**replica_runtime_env(plan), "IMAGE": resolve_image(plan.profile.deployment.image,
                                                               environ)}  # fmt: skip
    compose_file = COMPOSE_FILE
    if args.gpu_sets:
        env["ROUTER_IMAGE"] = resolve_image("kit", environ, override_var="ROUTER_IMAGE")
        doc = compose_document(plan, args.gpu_sets, int(environ.get("HOST_PORT", "8000")),
                               environ.get("BIND_ADDRESS", "127.0.0.1"))  # fmt: skip
        compose_file = REPLICAS_FILE
        if not args.dry_run:
            compose_file.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    argv = ["docker", "compose", "-f", str(compose_file),
            *(["config"] if args.config else ["up", "--detach"])]  # fmt: skip
    shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    print(f"{shown} {shlex.join(argv)}", flush=True)
    if args.dry_run:
        return 0
    docker = shutil.which("docker")
    if docker is None:
        raise ProfileError(
            "docker", None, "is not on PATH", "install Docker with the compose plugin"
        )
    os.execve(docker, argv, {**os.environ, **env})
    return 0  # pragma: no cover - execve does not return

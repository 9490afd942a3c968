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
from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from launch.commands.common import add_profile_arguments, profile_name
from launch.commands.render_cmd import compose_document
from launch.compose_env import ENV_PATH, user_settings, write_generated
from launch.compose_files import compose_files
from launch.docker_api import docker_path, require_local_image
from launch.image_lock import COMPOSE_DIR, is_local_id, resolve_image
from launch.plan import build_plan
from launch.render import Plan
from launch.scale import replica_runtime_env, router_source

NAME = "configure"
REPLICAS_FILE = COMPOSE_DIR / "replicas.generated.yaml"


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-sets",
        default=os.environ.get("GPU_SETS"),
        help='one replica per set behind the router, e.g. "0,1,2,3 4,5,6,7" (GPU_SETS)',
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="CPU profiles: this many replicas behind the router (GPU profiles use --gpu-sets)",
    )


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="write compose/.env for a profile")
    add_profile_arguments(parser)
    add_replica_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="print, do not write")
    return parser


@dataclass(frozen=True)
class Configured:
    plan: Plan
    values: dict[str, str]
    replicas_doc: dict | None


def plan_for_compose(args: argparse.Namespace, environ: Mapping[str, str]) -> Plan:
    """The profile with the user's compose/.env, the environment and `--set` applied, validated."""
    env_file = user_settings()
    settings = {**env_file, **environ}
    return build_plan(profile_name(args, settings), args.sets, environ, None, env_file)


def configure(
    args: argparse.Namespace, environ: Mapping[str, str], plan: Plan | None = None
) -> Configured:
    """The compose settings for the profile (`plan`, if already made), validated; writes
    nothing."""
    settings = {**user_settings(), **environ}
    plan = plan or plan_for_compose(args, environ)
    values = {
        **replica_runtime_env(plan),
        "IMAGE": resolve_image(plan.profile.deployment.image, settings),
        "COMPOSE_FILE": compose_files(plan.profile.deployment.device),
    }
    doc = None
    if args.gpu_sets or args.replicas is not None:
        values["ROUTER_IMAGE"] = resolve_image(router_source(plan), settings,
                                               override_var="ROUTER_IMAGE")  # fmt: skip
        doc = compose_document(plan, args.gpu_sets, args.replicas,
                               int(settings.get("HOST_PORT", "8000")),
                               settings.get("BIND_ADDRESS", "127.0.0.1"))  # fmt: skip
        values["COMPOSE_FILE"] = REPLICAS_FILE.name
    return Configured(plan, values, doc)


def write(result: Configured) -> None:
    if result.replicas_doc is not None:
        REPLICAS_FILE.write_text(yaml.safe_dump(result.replicas_doc, sort_keys=False),
                                 encoding="utf-8")  # fmt: skip
    write_generated(result.values, f"profile {result.plan.profile.name}")


def prepare_compose(result: Configured) -> str:
    """Before a command runs compose on `result`: the docker CLI (exit 2 if none), a locally
    pinned image still on this engine, then compose/.env written. Returns the CLI's path."""
    docker = docker_path()
    if is_local_id(result.values["IMAGE"]):
        require_local_image(result.values["IMAGE"])
    write(result)
    return docker


def show(result: Configured) -> str:
    return "\n".join(f"{k}={v}" for k, v in result.values.items())


def run(args: argparse.Namespace) -> int:
    result = configure(args, os.environ)
    print(show(result))
    if not args.dry_run:
        write(result)
        print(f"# written to {ENV_PATH}; start with `docker compose up -d` in {COMPOSE_DIR}")
    return 0

"""What compose needs to run a profile: the block `launch configure` writes after the marker in
compose/.env (PROFILE, IMAGE, SHM_SIZE, HEALTH_START_PERIOD, COMPOSE_FILE) and, for replicas, the
generated compose file. Typed values in, typed values out; the commands parse arguments."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import yaml

from launch.compose_env import user_settings, write_generated
from launch.compose_files import compose_files, merged_document
from launch.docker_api import docker_path, require_local_image
from launch.image_lock import COMPOSE_DIR, is_local_id, resolve_image
from launch.render import Plan
from launch.scale import (
    compose_replicas,
    cpu_replicas,
    parse_gpu_sets,
    replica_runtime_env,
    router_source,
)

REPLICAS_FILE = COMPOSE_DIR / "replicas.generated.yaml"


@dataclass(frozen=True)
class Configured:
    plan: Plan
    values: dict[str, str]
    replicas_doc: dict | None


def compose_document(plan: Plan, gpu_sets: str | None, replicas: int | None, host_port: int,
                     bind: str) -> dict:  # fmt: skip
    """The replica compose file for `plan`, from the base compose file as written."""
    if plan.profile.deployment.device == "cpu" or replicas is not None:
        sets = cpu_replicas(replicas, plan)
    else:
        default = ",".join(map(str, plan.profile.deployment.gpu_devices))
        sets = parse_gpu_sets(gpu_sets or default, plan)
    base = merged_document(plan.profile.deployment.device)
    return compose_replicas(plan, sets, base=base, host_port=host_port, bind=bind)


def configure(plan: Plan, environ: Mapping[str, str], gpu_sets: str | None = None,
              replicas: int | None = None) -> Configured:  # fmt: skip
    """The compose settings for `plan` (replicas behind the router when `gpu_sets` or
    `replicas` is given), validated; writes nothing."""
    settings = {**user_settings(), **environ}
    values = {
        **replica_runtime_env(plan),
        "IMAGE": resolve_image(plan.profile.deployment.image, settings),
        "COMPOSE_FILE": compose_files(plan.profile.deployment.device),
    }
    doc = None
    if gpu_sets or replicas is not None:
        values["ROUTER_IMAGE"] = resolve_image(router_source(plan), settings,
                                               override_var="ROUTER_IMAGE")  # fmt: skip
        doc = compose_document(plan, gpu_sets, replicas, int(settings.get("HOST_PORT", "8000")),
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

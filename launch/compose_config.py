"""What compose needs to run a profile: the block `launch configure` writes after the marker in
compose/.env (PROFILE, IMAGE, SHM_SIZE, HEALTH_START_PERIOD, COMPOSE_FILE) and, for replicas, the
generated compose file. Typed values in, typed values out; the commands parse arguments."""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

from launch.compose_env import write_generated
from launch.compose_files import compose_files, merged_document
from launch.docker_api import docker_path, require_local_image
from launch.errors import UsageError
from launch.image_lock import COMPOSE_DIR, MONITORING_SOURCES, is_local_id, resolve_image
from launch.plan import Plan
from launch.scale import (
    MONITORING_PROFILES,
    ROUTER_METRICS_PORT,
    compose_replicas,
    cpu_replicas,
    parse_gpu_sets,
    replica_runtime_env,
    router_source,
)
from launch.settings import SECRETS, SECRETS_DIR, Settings, refuse_secrets_as_environment

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


MONITORING_PROFILE, GPU_MONITORING_PROFILE = MONITORING_PROFILES
"""Prometheus and Grafana; dcgm-exporter (only on a host with the NVIDIA runtime)."""
DCGM_TARGET = "dcgm-exporter:9400"
GRAFANA_PASSWORD_FILE = SECRETS_DIR / SECRETS["GRAFANA_ADMIN_PASSWORD"]


def monitoring_values(plan: Plan, settings: Settings, doc: dict | None, *,
                      gpu_exporter: bool) -> dict[str, str]:
    """What compose needs for the monitoring profiles: their images by digest, and what
    Prometheus scrapes (every vLLM server, the router when scaled out, dcgm-exporter where the
    NVIDIA runtime is and the profile uses GPUs)."""
    services = (doc or {}).get("services", {})
    servers = sorted(s for s in services if s.startswith("vllm-"))
    port_in = plan.profile.deployment.port
    gpus = gpu_exporter and plan.profile.deployment.device == "cuda"
    values = {
        # `docker compose up`/`down` then include them (compose reads COMPOSE_PROFILES)
        "COMPOSE_PROFILES": ",".join([MONITORING_PROFILE] + [GPU_MONITORING_PROFILE] * gpus),
        **{key: resolve_image(source, settings.merged) for source, key
           in MONITORING_SOURCES.items() if gpus or source != "dcgm-exporter"},
        "PROMETHEUS_TARGETS": ",".join(f"{s}:{port_in}" for s in servers or ["vllm"]),
    }  # fmt: skip
    if "router" in services:
        values["ROUTER_METRICS_TARGETS"] = f"router:{ROUTER_METRICS_PORT}"
    if gpus:
        values["DCGM_TARGETS"] = DCGM_TARGET
    return values


def configure(plan: Plan, settings: Settings, gpu_sets: str | None = None,
              replicas: int | None = None, *, monitoring: bool = False,
              gpu_exporter: bool = False) -> Configured:  # fmt: skip
    """The compose settings for `plan` (replicas behind the router when `gpu_sets` (else
    GPU_SETS) or `replicas` is given; Prometheus and Grafana watching them with `monitoring`,
    and dcgm-exporter too with `gpu_exporter`, the NVIDIA runtime being present), validated;
    writes nothing."""
    gpu_sets = gpu_sets or settings.gpu_sets
    port, bind = settings.host_port, settings.bind_address  # compose publishes these: checked
    refuse_secrets_as_environment(settings.env_file, "compose/.env")
    if not ipaddress.ip_address(bind).is_loopback and not settings.api_key():
        raise UsageError(
            "BIND_ADDRESS", bind,
            "publishes the API beyond this host, and no API key is set: anyone who reaches the "
            "port would use the GPUs",
            f"write a key to {settings.api_key_file} (e.g. `python3 -c 'import secrets; "
            f"print(secrets.token_urlsafe(32))' > {settings.api_key_file}`), or "
            "BIND_ADDRESS=127.0.0.1",
        )  # fmt: skip
    values = {
        **replica_runtime_env(plan),
        "IMAGE": resolve_image(plan.profile.deployment.image, settings.merged),
        "COMPOSE_FILE": compose_files(plan.profile.deployment.device),
    }
    doc = None
    if gpu_sets or replicas is not None:
        values["ROUTER_IMAGE"] = resolve_image(router_source(plan), settings.merged,
                                               override_var="ROUTER_IMAGE")  # fmt: skip
        doc = compose_document(plan, gpu_sets, replicas, port, bind)
        values["COMPOSE_FILE"] = REPLICAS_FILE.name
    if monitoring:
        values |= monitoring_values(plan, settings, doc, gpu_exporter=gpu_exporter)
    return Configured(plan, values, doc)


def ensure_secret_files() -> None:
    """compose/secrets with one file per secret compose mounts (an empty file: no key, no token),
    so `docker compose up` finds every secret it declares. The directory is the owner's alone;
    the files are world-readable inside it, as the server's unprivileged user reads them through
    the bind mount compose makes."""
    SECRETS_DIR.mkdir(mode=0o700, exist_ok=True)
    SECRETS_DIR.chmod(0o700)
    for name in SECRETS.values():
        path = SECRETS_DIR / name
        if not path.exists():
            path.touch(mode=0o644)
        path.chmod(0o644)


def ensure_grafana_password(path: Path = GRAFANA_PASSWORD_FILE) -> bool:
    """A random Grafana admin password in its secret file when the file is empty or absent
    (Grafana would otherwise start with its well-known default); True when one was written."""
    if path.is_file() and path.read_text(encoding="utf-8").strip():
        return False
    path.write_text(secrets.token_urlsafe(24), encoding="utf-8")
    return True


def write(result: Configured) -> None:
    ensure_secret_files()
    monitored = MONITORING_PROFILE in result.values.get("COMPOSE_PROFILES", "").split(",")
    if monitored and ensure_grafana_password():
        print(f"# Grafana: a random admin password written to {GRAFANA_PASSWORD_FILE}")
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

"""Several four-GPU replicas behind vLLM's router: compose services and Kubernetes manifests.

Both are rendered from the same plan (profile + overrides), so what they share (the profile,
port, shared-memory size, start-up budget, image digest) is written once. Pure functions: they
return plain data that the commands print or write.
"""

from __future__ import annotations

import copy
from typing import Any

from launch.errors import UsageError
from launch.gpus import example_gpus, gpu_list_problem, parse_gpus
from launch.plan import Plan

ROUTER_PORT = 8000
MONITORING_PROFILES = ("monitoring", "gpu-monitoring")
"""compose/compose.yaml's profiles of Prometheus and Grafana, and of dcgm-exporter."""
ROUTER_METRICS_PORT = 29000
"""vllm-router's Prometheus exporter (its default port), on the project's network only: the
monitoring profile scrapes it; compose does not publish it."""
ROUTER_POLICY = "cache_aware"  # prefix-aware routing keeps a conversation's KV cache warm
SECRET = "glm53-secrets"
"""The Kubernetes Secret holding the files compose mounts at /run/secrets (keys vllm_api_key,
hf_token; both optional): `kubectl create secret generic glm53-secrets
--from-file=compose/secrets/vllm_api_key --from-file=compose/secrets/hf_token`."""
SECRETS_MOUNT = "/run/secrets"
PROBE_PERIOD_S = 10
CLAIMS = {"hf-cache": "200Gi", "jit-cache": "50Gi"}
"""Each replica's volume claims (compose's two named volumes) and the storage they request.
Requests, not measurements: the Hub cache must hold the checkpoint (`make fetch` says how many
bytes a download needs before it starts), the JIT cache the kernel and compile caches compose
keeps in jit-cache; raise them in the rendered manifest for a larger checkpoint."""


def parse_gpu_sets(text: str, plan: Plan) -> list[tuple[int, ...]]:
    """`"0,1,2,3 4,5,6,7"` -> GPU sets, each TP x PP GPUs, no GPU in two sets."""
    need = plan.profile.engine.world_size
    sets: list[tuple[int, ...]] = []
    for word in text.split():
        gpus = parse_gpus(word)
        problem = "is not a list of GPU indices" if gpus is None else gpu_list_problem(gpus, need)
        if problem or gpus is None:
            raise UsageError("GPU_SETS", text, f"set {word!r} {problem}",
                             f'one set of {need} distinct GPUs per replica, e.g. GPU_SETS='
                             f'"{example_gpus(need)} ..."')  # fmt: skip
        sets.append(gpus)
    used = [g for s in sets for g in s]
    if not sets or len(used) != len(set(used)):
        raise UsageError(
            "GPU_SETS",
            text,
            "must name at least one set and use each GPU once",
            'e.g. GPU_SETS="0,1,2,3 4,5,6,7"',
        )
    return sets


def cpu_replicas(count: int | None, plan: Plan) -> list[tuple[int, ...]]:
    """`--replicas N` for a CPU profile: N replicas, none holding a GPU."""
    if plan.profile.deployment.device != "cpu":
        raise UsageError(
            "--replicas", count, "sets the replica count of CPU profiles only",
            'give GPU profiles one GPU set per replica: --gpu-sets "0,1,2,3 4,5,6,7"',
        )  # fmt: skip
    if count is None or count < 1:
        raise UsageError("--replicas", count, "must be at least 1", "e.g. --replicas 2")
    return [()] * count


def router_source(plan: Plan) -> str:
    """The image source the router runs from: the profile's image when it is one of the kit's
    (it carries vllm-router), else the kit's CUDA image."""
    source = plan.profile.deployment.image
    return source if source in ("kit", "cpu") else "kit"


def replica_runtime_env(plan: Plan) -> dict[str, str]:
    """What compose interpolates from the profile (the base service reads these)."""
    d = plan.profile.deployment
    return {
        "PROFILE": plan.profile.name,
        "SHM_SIZE": f"{d.shm_size_gib}gb",
        "HEALTH_START_PERIOD": f"{d.startup_budget_s}s",
        "STOP_GRACE_PERIOD": f"{plan.profile.stop_grace_s}s",
    }


def compose_replicas(plan: Plan, gpu_sets: list[tuple[int, ...]], *, base: dict[str, Any],
                     host_port: int, bind: str) -> dict[str, Any]:  # fmt: skip
    """A compose file: one copy of the base `vllm` service per GPU set, and the router.

    Replica i publishes `host_port + 1 + i` (for a per-replica smoke check); the router publishes
    `host_port`, the port users call, and starts once every replica is healthy. Everything else
    is the base service as compose/compose.yaml and the device's overlay write it
    (`launch.compose_files.merged_document`).
    """
    port = plan.profile.deployment.port
    services: dict[str, Any] = {}
    for i, gpus in enumerate(gpu_sets):
        service = copy.deepcopy(base["services"]["vllm"])
        service["ports"] = [f"{bind}:{host_port + 1 + i}:{port}"]
        reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
        for device in reservations.get("devices", []):  # none on a CPU service
            device["device_ids"] = [",".join(map(str, gpus))]
        services[f"vllm-{i}"] = service
    services["router"] = {
        "image": "${ROUTER_IMAGE:?ROUTER_IMAGE (vllm-router) is written by make configure}",
        "entrypoint": router_argv([f"http://vllm-{i}:{port}" for i in range(len(gpu_sets))]),
        "ports": [f"{bind}:{host_port}:{ROUTER_PORT}"],
        "depends_on": {f"vllm-{i}": {"condition": "service_healthy"}
                       for i in range(len(gpu_sets))},
        "init": True,
    }  # fmt: skip
    # the monitoring profiles watch the replicas and the router (`make configure` writes
    # PROMETHEUS_TARGETS and ROUTER_METRICS_TARGETS)
    services |= {name: copy.deepcopy(service) for name, service in base["services"].items()
                 if set(service.get("profiles", ())) & set(MONITORING_PROFILES)}  # fmt: skip
    return {"name": base["name"], "services": services, "volumes": copy.deepcopy(base["volumes"]),
            "secrets": copy.deepcopy(base["secrets"]), "configs": copy.deepcopy(base["configs"])}


def router_argv(workers: list[str]) -> list[str]:
    return [
        "vllm-router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT),
        "--prometheus-host", "0.0.0.0", "--prometheus-port", str(ROUTER_METRICS_PORT),
        "--policy", ROUTER_POLICY, "--worker-urls", *workers,
    ]  # fmt: skip


def _probe(path: str, port: int, failures: int, period: int = PROBE_PERIOD_S) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures}  # fmt: skip


KIT_ROOT = "/opt/kit"
"""Where compose mounts the checkout's kit packages (the launcher and the geometry plugin) for an
image that does not carry them."""


def kit_configmap(name: str, files: dict[str, str]) -> tuple[dict[str, Any], dict[str, list]]:
    """The kit's packages as one ConfigMap (keys cannot hold '/', so paths become items), and
    the items of each package (path below /opt/kit -> its first part) for its own mount."""
    keys = {rel: rel.replace("/", "__") for rel in sorted(files)}
    items: dict[str, list[dict[str, str]]] = {}
    for rel, key in keys.items():
        package, _, below = rel.partition("/")
        items.setdefault(package, []).append({"key": key, "path": below})
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{name}-kit"},
        "data": {keys[rel]: files[rel] for rel in keys},
    }, items  # fmt: skip


def kit_mounts(service: dict[str, Any]) -> list[str]:
    """The kit package paths the compose service mounts read-only (`../X:/opt/kit/X:ro`)."""
    targets = (str(v).rsplit(":", 2) for v in service.get("volumes", []))
    under = f"{KIT_ROOT}/"
    return [t[1] for t in targets if len(t) == 3 and t[2] == "ro" and t[1].startswith(under)]


def k8s_manifests(plan: Plan, image: str, router_image: str | None, replicas: int, *,
                  service: dict[str, Any], kit_files: dict[str, str]) -> list[dict]:  # fmt: skip
    """StatefulSet of `replicas` vLLM pods and their headless Service; the router and its Service
    unless `router_image` is None; the launcher ConfigMap where the compose service mounts the
    checkout's launcher.

    The pod runs what the compose `service` runs (merged compose file, `compose_files`): its
    entrypoint, its environment (cache directories, PYTHONPATH, GPUS_FROM_RUNTIME, the secret
    files' paths), the API key and Hub token as files from the Secret at /run/secrets, and the
    kit's packages mounted the same way (the launcher and the geometry plugin, from one
    ConfigMap). `kit_files` maps paths below /opt/kit to their text.
    """
    p = plan.profile
    d, e = p.deployment, p.engine
    name = f"glm53-{p.name}"
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "vllm"}
    gpus = e.world_size
    # GPUs through the NVIDIA device plugin; a CPU profile asks for none
    resources = (
        {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}}
        if d.device == "cuda"
        else {}
    )
    env = [{"name": k, "value": v} for k, v in plan.env.items() if k != "CUDA_VISIBLE_DEVICES"]
    env += [{"name": k, "value": str(v)} for k, v in service["environment"].items()]
    mounted = kit_mounts(service)
    pod = {
        "metadata": {"labels": labels},
        "spec": {
            # SIGTERM, the profile's drain for requests in flight, the engine's teardown
            "terminationGracePeriodSeconds": p.stop_grace_s,
            "containers": [{
                "name": "vllm",
                "image": image,
                "command": list(service["entrypoint"]),
                "args": [p.name],
                "env": env,
                "ports": [{"name": "http", "containerPort": d.port}],
                "resources": resources,
                "startupProbe": _probe("/health", d.port, d.startup_budget_s // PROBE_PERIOD_S),
                "readinessProbe": _probe("/health", d.port, 3),
                "livenessProbe": _probe("/health", d.port, 3, period=30),
                "volumeMounts": [
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    {"name": "hf-cache", "mountPath": "/hf"},
                    {"name": "jit-cache", "mountPath": "/cache"},
                    # the secrets as files, where compose mounts them (never environment)
                    {"name": "secrets", "mountPath": SECRETS_MOUNT, "readOnly": True},
                ],
            }],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory",
                                                      "sizeLimit": f"{d.shm_size_gib}Gi"}},
                        {"name": "secrets", "secret": {"secretName": SECRET, "optional": True,
                                                       "defaultMode": 0o444}}],
        },
    }  # fmt: skip
    docs: list[dict[str, Any]] = []
    if mounted:
        configmap, items = kit_configmap(name, kit_files)
        docs.append(configmap)
        for path in mounted:
            package = path.removeprefix(f"{KIT_ROOT}/")
            pod["spec"]["containers"][0]["volumeMounts"].append(
                {"name": f"kit-{package}", "mountPath": path, "readOnly": True})  # fmt: skip
            pod["spec"]["volumes"].append(
                {"name": f"kit-{package}", "configMap": {"name": configmap["metadata"]["name"],
                                                         "items": items[package]}})  # fmt: skip

    def claim(claim_name: str, size: str) -> dict[str, Any]:
        return {"metadata": {"name": claim_name},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": size}}}}  # fmt: skip

    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": pod,
            "volumeClaimTemplates": [claim(n, size) for n, size in CLAIMS.items()],
        },
    }
    headless = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"clusterIP": "None", "selector": labels,
                 "ports": [{"name": "http", "port": d.port, "targetPort": d.port}]},
    }  # fmt: skip
    docs += [statefulset, headless]
    if router_image is None:
        return docs
    workers = [f"http://{name}-{i}.{name}:{d.port}" for i in range(replicas)]
    router_labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "router"}
    router = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"{name}-router", "labels": router_labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": router_labels},
            "template": {"metadata": {"labels": router_labels}, "spec": {"containers": [{
                "name": "router",
                "image": router_image,
                "command": router_argv(workers),
                "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
                "readinessProbe": _probe("/health", ROUTER_PORT, 3),
                "livenessProbe": _probe("/health", ROUTER_PORT, 3, period=30),
            }]}},
        },
    }  # fmt: skip
    router_service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{name}-router", "labels": router_labels},
        "spec": {"selector": router_labels,
                 "ports": [{"name": "http", "port": 80, "targetPort": ROUTER_PORT}]},
    }  # fmt: skip
    return [*docs, router, router_service]

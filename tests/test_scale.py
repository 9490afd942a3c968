"""Scale-out: Kubernetes manifests validate offline; vLLM's router runs for real on 127.0.0.1
in front of two stand-in replicas; the compose file with two GPU sets validates."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import yaml

from launch.__main__ import main as launch_main
from launch.compose_files import merged_document
from smoke.__main__ import main as smoke_main
from tests.conftest import REPO, free_port, server_on_free_port
from tests.standin import StandIn
from tests.test_image_compose import compose_config, runtime_env

BIN = Path(sys.executable).parent
DIGEST = "registry.example/kit/glm53@sha256:" + "ab" * 32
ROUTER_DIGEST = "registry.example/kit/glm53@sha256:" + "cd" * 32


def render(capsys, monkeypatch, *argv: str) -> str:
    monkeypatch.setenv("IMAGE", DIGEST)
    monkeypatch.setenv("ROUTER_IMAGE", ROUTER_DIGEST)
    capsys.readouterr()
    assert launch_main(["render", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", ["dflash-tp4-dcp4", "mtp3-tp4-split"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_k8s_manifests_validate_and_carry_gpus_digest_probes_secret(
    tmp_path, capsys, monkeypatch, name, replicas
):
    text = render(capsys, monkeypatch, name, "--format", "k8s", "--replicas", str(replicas))
    path = tmp_path / "manifests.yaml"
    path.write_text(text)
    result = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", str(path)],
                            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == 5
    launcher, sts, headless, router, router_svc = yaml.safe_load_all(text)
    # the pod runs what the compose service runs: its entrypoint, environment and kit mount
    compose = merged_document("cuda")["services"]["vllm"]
    assert launcher["kind"] == "ConfigMap"
    assert (sts["kind"], headless["kind"], router["kind"], router_svc["kind"]) == (
        "StatefulSet",
        "Service",
        "Deployment",
        "Service",
    )
    assert sts["spec"]["replicas"] == replicas
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == DIGEST and container["args"] == [name]
    assert container["command"] == compose["entrypoint"] == ["python3", "-m", "launch", "run"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: env[k] for k in compose["environment"]} == {
        k: str(v) for k, v in compose["environment"].items()
    }
    assert env["TRITON_CACHE_DIR"] == "/cache/triton" and env["B12X_CACHE_DIR"] == "/cache/b12x"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "kit-launch")
    assert mount == {"name": "kit-launch", "mountPath": "/opt/kit/launch", "readOnly": True}
    items = next(v for v in pod["volumes"] if v["name"] == "kit-launch")["configMap"]["items"]
    paths = {i["path"] for i in items}
    assert {"__main__.py", "commands/run_cmd.py", f"profiles/{name}.yaml"} <= paths
    assert launcher["data"]["launch__commands__run_cmd.py"] == (
        REPO / "launch" / "commands" / "run_cmd.py"
    ).read_text()
    # the geometry plugin reaches the pod the way it reaches the compose service
    plugin = next(m for m in container["volumeMounts"] if m["name"] == "kit-kvgeometry")
    assert plugin == {"name": "kit-kvgeometry", "mountPath": "/opt/kit/kvgeometry",
                      "readOnly": True}  # fmt: skip
    items = next(v for v in pod["volumes"] if v["name"] == "kit-kvgeometry")["configMap"]["items"]
    assert {i["path"] for i in items} == {p.name for p in (REPO / "kvgeometry").glob("*.py")}
    assert {"__init__.py", "line.py", "report.py"} <= {i["path"] for i in items}
    plugin_source = (REPO / "kvgeometry" / "report.py").read_text()
    assert launcher["data"]["kvgeometry__report.py"] == plugin_source
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    startup = container["startupProbe"]
    assert startup["failureThreshold"] * startup["periodSeconds"] == 2400
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # the API key and the Hub token as files from a Secret, where compose mounts them; no
    # secret in the environment
    assert not {"HF_TOKEN", "VLLM_API_KEY"} & set(env)
    assert (env["KIT_API_KEY_FILE"], env["HF_TOKEN_PATH"]) == (
        "/run/secrets/vllm_api_key", "/run/secrets/hf_token")
    secrets = next(v for v in pod["volumes"] if v["name"] == "secrets")["secret"]
    assert secrets == {"secretName": "glm53-secrets", "optional": True, "defaultMode": 0o444}
    assert {"name": "secrets", "mountPath": "/run/secrets", "readOnly": True} in (
        container["volumeMounts"])
    assert pod["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    # SIGTERM, then the profile's drain (--shutdown-timeout 60) and the engine's teardown
    assert pod["terminationGracePeriodSeconds"] == 90
    assert [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]] == [
        "hf-cache",
        "jit-cache",
    ]
    router_container = router["spec"]["template"]["spec"]["containers"][0]
    assert router_container["image"] == ROUTER_DIGEST
    workers = router_container["command"][router_container["command"].index("--worker-urls") + 1 :]
    assert workers == [f"http://glm53-{name}-{i}.glm53-{name}:8000" for i in range(replicas)]


def replicas_config(capsys, monkeypatch, profile: str, *argv: str) -> dict:
    """`render --format compose` for `profile`, resolved by the real Compose binary."""
    text = render(capsys, monkeypatch, profile, "--format", "compose", *argv)
    # in compose/ (the document's relative paths start there), a name of its own per test: the
    # tests run side by side (`make test`)
    compose_dir = Path(__file__).resolve().parent.parent / "compose"
    with tempfile.NamedTemporaryFile("w", dir=compose_dir, prefix="replicas.test.",
                                     suffix=".yaml", delete=False) as fh:  # fmt: skip
        fh.write(text)
    path = Path(fh.name)
    try:
        result = compose_config({**runtime_env(profile), "IMAGE": DIGEST,
                                 "ROUTER_IMAGE": ROUTER_DIGEST}, path)  # fmt: skip
    finally:
        path.unlink()
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["services"]


def test_k8s_without_a_router_needs_no_kit_image(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("IMAGE", raising=False)
    monkeypatch.delenv("ROUTER_IMAGE", raising=False)
    assert launch_main(["render", "dflash-tp4-dcp4", "--format", "k8s", "--replicas", "2",
                        "--no-router"]) == 0  # fmt: skip
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["ConfigMap", "StatefulSet", "Service"]
    assert launch_main(["render", "dflash-tp4-dcp4", "--format", "k8s", "--replicas", "2"]) == 2
    assert capsys.readouterr().err.startswith("error: KIT_IMAGE='': has no image digest")


def test_k8s_manifests_of_the_cpu_profile_ask_for_no_gpu(tmp_path, capsys, monkeypatch):
    text = render(capsys, monkeypatch, "cpu-tiny", "--format", "k8s", "--replicas", "2")
    path = tmp_path / "manifests.yaml"
    path.write_text(text)
    result = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", str(path)],
                            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    sts = next(yaml.safe_load_all(text))
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {} and container["args"] == ["cpu-tiny"]


def test_compose_with_two_gpu_sets_shows_two_replicas_and_the_router(capsys, monkeypatch):
    services = replicas_config(capsys, monkeypatch, "dflash-tp4-dcp4", "--gpu-sets",
                               "0,1,2,3 4,5,6,7")  # fmt: skip
    assert sorted(services) == ["router", "vllm-0", "vllm-1"]
    devices = [services[f"vllm-{i}"]["deploy"]["resources"]["reservations"]["devices"][0]
               ["device_ids"] for i in range(2)]  # fmt: skip
    assert devices == [["0,1,2,3"], ["4,5,6,7"]]
    assert [services[f"vllm-{i}"]["ports"][0]["published"] for i in range(2)] == ["8001", "8002"]
    assert services["router"]["ports"][0]["published"] == "8000"
    assert services["router"]["image"] == ROUTER_DIGEST
    assert set(services["router"]["depends_on"]) == {"vllm-0", "vllm-1"}
    assert all(d["condition"] == "service_healthy"
               for d in services["router"]["depends_on"].values())  # fmt: skip


def test_cpu_replicas_take_the_cpu_overlay_and_the_router_runs_its_own_entrypoint(
    capsys, monkeypatch
):
    services = replicas_config(capsys, monkeypatch, "cpu-tiny", "--replicas", "2")
    assert sorted(services) == ["router", "vllm-0", "vllm-1"]
    for i in range(2):  # as compose/cpu.yaml says: no GPUs, no checkout mount, no memlock
        replica = services[f"vllm-{i}"]
        assert "deploy" not in replica and replica["ulimits"] == {"stack": 67108864}
        assert [v["target"] for v in replica["volumes"]] == ["/hf", "/cache"]
    # the image's ENTRYPOINT is the launcher, so the router replaces it, not its arguments
    assert services["router"]["entrypoint"][:1] == ["vllm-router"]
    assert services["router"].get("command") is None


def test_replicas_without_gpu_sets_are_for_cpu_profiles_only(capsys, monkeypatch):
    monkeypatch.setenv("IMAGE", DIGEST)
    assert launch_main(["render", "mtp3-tp4-split", "--format", "compose", "--replicas", "2"]) == 2
    assert "--replicas=2: sets the replica count of CPU profiles only" in capsys.readouterr().err


def test_bad_gpu_sets_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("IMAGE", DIGEST)
    for sets in ("0,1,2 3,4,5", "0,1,2,3 3,4,5,6", "0,1,2,x"):
        assert launch_main(["render", "dflash-tp4-dcp4", "--format", "compose",
                            "--gpu-sets", sets]) == 2  # fmt: skip
        assert "GPU_SETS=" in capsys.readouterr().err


@contextmanager
def router(workers: list[str]) -> Iterator[str]:
    """The real vllm-router in front of `workers`, once it answers /health. Its Prometheus
    exporter gets a free port of its own: on its default (29000) a second router running beside
    (the tests run side by side) never answered /health."""
    argv = lambda port: [  # noqa: E731
        str(BIN / "vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy",
        "round_robin", "--worker-urls", *workers, "--health-check-interval-secs", "1",
        "--health-failure-threshold", "1", "--worker-startup-timeout-secs", "20",
        "--prometheus-port", str(free_port())]  # fmt: skip
    with server_on_free_port(argv, lambda port: f"http://127.0.0.1:{port}/health") as port:
        yield f"http://127.0.0.1:{port}"


def ask(url: str) -> int:
    body = {"model": "local-inference-lab/GLM-5.3-Flash-NVFP4", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Reply with exactly READY"}]}  # fmt: skip
    return requests.post(f"{url}/v1/chat/completions", json=body, timeout=10).status_code


def test_router_spreads_requests_and_survives_a_dead_replica(capsys):
    a, b = StandIn(), StandIn()
    a.__enter__()
    with b, router([a.url, b.url]) as url:
        assert [ask(url) for _ in range(6)] == [200] * 6
        assert a.chat_requests > 0 and b.chat_requests > 0
        a.__exit__(None, None, None)  # replica 0 dies
        time.sleep(3)
        before = b.chat_requests
        assert [ask(url) for _ in range(6)] == [200] * 6
        assert b.chat_requests - before == 6


def test_smoke_check_passes_through_the_router_and_on_each_replica(capsys):
    with StandIn() as a, StandIn() as b, router([a.url, b.url]) as url:
        for target in (url, a.url, b.url):
            code = smoke_main(["check", "--profile", "mtp3-tp4-split", "--url", target,
                               "--no-log", "--timeout", "10", "--json"])  # fmt: skip
            verdict = json.loads(capsys.readouterr().out)
            assert code == 0, verdict

"""The monitoring compose profiles as `make configure MONITORING=1` writes them and the real
Compose binary resolves them: Prometheus and Grafana on 127.0.0.1 only, Prometheus scraping every
vLLM server of the project with the API key's file (and the router, and dcgm-exporter where the
NVIDIA runtime is), Grafana with no default credentials and the kit's dashboard, data in their
own volumes, and nothing of it without the profile. The real Prometheus scrapes the real engine
in `make e2e` (tests/e2e/steps/monitoring.py); Grafana and dcgm-exporter cannot be pulled here
and are rendered only."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest

from launch.compose_config import compose_document, configure, ensure_grafana_password
from launch.errors import UsageError
from launch.image_lock import lock_path as lock_file
from launch.image_lock import read_lock, write_lock
from launch.settings import Settings
from serving.dashboard import DASHBOARD_FILE
from tests.conftest import REPO, plan_of
from tests.test_image_compose import compose_config, runtime_env

PROMETHEUS = "registry.example/kit/prometheus@sha256:" + "ef" * 32
IMAGE = "registry.example/kit/glm53@sha256:" + "ab" * 32


@pytest.fixture
def pinned() -> None:
    """Prometheus and the CPU image pinned in the test's own copy of the lock (conftest)."""
    write_lock({"PROMETHEUS_IMAGE": PROMETHEUS, "CPU_IMAGE": IMAGE})


def config_of(values: dict[str, str], file: Path | None = None) -> dict:
    env = {**runtime_env("cpu-tiny"), **values}
    done = compose_config(env, file) if file else compose_config(env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_monitoring_adds_prometheus_to_what_compose_runs(pinned):
    values = configure(plan_of("cpu-tiny"), Settings(), monitoring=True).values
    assert values["COMPOSE_PROFILES"] == "monitoring"
    assert values["PROMETHEUS_IMAGE"] == PROMETHEUS
    assert values["PROMETHEUS_TARGETS"] == "vllm:8000"
    doc = config_of({**values, "IMAGE": IMAGE})
    prometheus = doc["services"]["prometheus"]
    assert prometheus["image"] == PROMETHEUS
    assert prometheus["ports"] == [{"mode": "ingress", "host_ip": "127.0.0.1", "target": 9090,
                                    "published": "9090", "protocol": "tcp"}]  # fmt: skip
    assert [s["source"] for s in prometheus["secrets"]] == ["vllm_api_key"]
    assert prometheus["volumes"][0]["source"] == "prometheus-data"
    assert doc["volumes"]["prometheus-data"]["name"] == "glm53-prometheus-data"
    assert "--storage.tsdb.retention.time=15d" in prometheus["command"]
    content = doc["configs"]["prometheus"]["content"]
    assert "targets: [vllm:8000]" in content
    assert "credentials_file: /run/secrets/vllm_api_key" in content
    # no router, no GPUs: nothing else to scrape
    assert "targets: []" in content and "dcgm-exporter" not in doc["services"]
    # without the profile, compose runs no Prometheus and no Grafana
    plain = configure(plan_of("cpu-tiny"), Settings()).values
    assert "COMPOSE_PROFILES" not in plain
    assert not {"prometheus", "grafana"} & set(config_of({**plain, "IMAGE": IMAGE})["services"])


def test_grafana_runs_by_digest_on_loopback_without_default_credentials(pinned):
    values = configure(plan_of("cpu-tiny"), Settings(), monitoring=True).values
    assert values["GRAFANA_IMAGE"] == read_lock(lock_file())["GRAFANA_IMAGE"]
    assert values["GRAFANA_IMAGE"].startswith("grafana/grafana@sha256:")
    doc = config_of({**values, "IMAGE": IMAGE})
    grafana = doc["services"]["grafana"]
    assert grafana["image"] == values["GRAFANA_IMAGE"]
    assert [(p["host_ip"], p["target"]) for p in grafana["ports"]] == [("127.0.0.1", 3000)]
    env = grafana["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert [s["source"] for s in grafana["secrets"]] == ["grafana_admin_password"]
    # the provisioned datasource is the project's Prometheus; the dashboard is the kit's file
    assert "url: http://prometheus:9090" in doc["configs"]["grafana-datasource"]["content"]
    assert Path(doc["configs"]["grafana-dashboard"]["file"]) == DASHBOARD_FILE
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert {"source": "grafana-dashboard", "target": home} in [
        {k: c[k] for k in ("source", "target")} for c in grafana["configs"]]
    assert grafana["volumes"][0]["source"] == "grafana-data"


def test_the_gpu_exporter_runs_only_for_a_gpu_profile_where_the_nvidia_runtime_is():
    write_lock({"PROMETHEUS_IMAGE": PROMETHEUS})
    plan = plan_of("mtp3-tp4-split")
    values = configure(plan, Settings(), monitoring=True, gpu_exporter=True).values
    assert values["COMPOSE_PROFILES"] == "monitoring,gpu-monitoring"
    assert values["DCGM_TARGETS"] == "dcgm-exporter:9400"
    assert values["DCGM_EXPORTER_IMAGE"].startswith("nvcr.io/nvidia/k8s/dcgm-exporter@sha256:")
    env = {**runtime_env("mtp3-tp4-split"), **values, "IMAGE": IMAGE}
    done = compose_config(env)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    dcgm = doc["services"]["dcgm-exporter"]
    assert dcgm["image"] == values["DCGM_EXPORTER_IMAGE"] and "ports" not in dcgm
    assert dcgm["cap_add"] == ["SYS_ADMIN"]
    assert dcgm["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert "targets: [dcgm-exporter:9400]" in doc["configs"]["prometheus"]["content"]
    # no NVIDIA runtime, or a CPU profile: no exporter
    without = configure(plan, Settings(), monitoring=True, gpu_exporter=False).values
    assert without["COMPOSE_PROFILES"] == "monitoring" and "DCGM_TARGETS" not in without
    write_lock({"CPU_IMAGE": IMAGE})
    cpu = configure(plan_of("cpu-tiny"), Settings(), monitoring=True, gpu_exporter=True).values
    assert cpu["COMPOSE_PROFILES"] == "monitoring" and "DCGM_EXPORTER_IMAGE" not in cpu


def test_configure_writes_a_random_grafana_password_and_keeps_the_users(tmp_path):
    path = tmp_path / "grafana_admin_password"
    path.touch()
    assert ensure_grafana_password(path)
    first = path.read_text()
    assert len(first) >= 32 and first != "admin"
    assert not ensure_grafana_password(path) and path.read_text() == first
    path.write_text("mine\n")
    assert not ensure_grafana_password(path) and path.read_text() == "mine\n"


def test_a_grafana_password_in_compose_env_is_refused(pinned):
    with pytest.raises(UsageError) as refused:
        configure(plan_of("cpu-tiny"), Settings(env_file={"GRAFANA_ADMIN_PASSWORD": "hunter2"}),
                  monitoring=True)  # fmt: skip
    message = str(refused.value)
    assert message.startswith("GRAFANA_ADMIN_PASSWORD='set in compose/.env'")
    assert "compose/secrets/grafana_admin_password" in message and "hunter2" not in message


def test_replicas_are_scraped_each(pinned):
    result = configure(plan_of("cpu-tiny"), Settings(), replicas=2, monitoring=True)
    assert result.values["PROMETHEUS_TARGETS"] == "vllm-0:8000,vllm-1:8000"
    assert result.values["ROUTER_METRICS_TARGETS"] == "router:29000"
    doc = compose_document(result.plan, None, 2, 8000, "127.0.0.1")
    import yaml

    with tempfile.NamedTemporaryFile("w", dir=REPO / "compose", prefix="replicas.test.",
                                     suffix=".yaml", delete=False) as fh:  # fmt: skip
        yaml.safe_dump(doc, fh, sort_keys=False)
    try:
        resolved = config_of({**result.values, "IMAGE": IMAGE, "ROUTER_IMAGE": IMAGE},
                             Path(fh.name))  # fmt: skip
    finally:
        Path(fh.name).unlink()
    assert {"vllm-0", "vllm-1", "router", "prometheus", "grafana"} <= set(resolved["services"])
    content = resolved["configs"]["prometheus"]["content"]
    assert "targets: [vllm-0:8000,vllm-1:8000]" in content
    # the router's exporter listens on the project's network, where Prometheus scrapes it
    assert "targets: [router:29000]" in content
    argv = resolved["services"]["router"]["entrypoint"]
    assert argv[argv.index("--prometheus-host") + 1] == "0.0.0.0"
    assert argv[argv.index("--prometheus-port") + 1] == "29000"
    assert "29000" not in json.dumps(resolved["services"]["router"]["ports"])


PUBLISHED_PROMETHEUS = re.compile(r"^prom/prometheus@sha256:[0-9a-f]{64}$")


def test_the_default_prometheus_is_the_publishers_by_digest():
    """The tracked lock (conftest's copy of it) gives the monitoring profile prom/prometheus by
    its index digest, and the real Compose binary renders it with the kit's command, data
    directory and scrape configuration."""
    write_lock({"CPU_IMAGE": IMAGE})
    tracked = read_lock(REPO / "compose" / "images.lock")["PROMETHEUS_IMAGE"]
    assert PUBLISHED_PROMETHEUS.match(tracked)
    values = configure(plan_of("cpu-tiny"), Settings(), monitoring=True).values
    assert values["PROMETHEUS_IMAGE"] == tracked
    prometheus = config_of({**values, "IMAGE": IMAGE})["services"]["prometheus"]
    assert prometheus["image"] == tracked
    assert "--storage.tsdb.path=/prometheus" in prometheus["command"]
    assert [(v["source"], v["target"]) for v in prometheus["volumes"]] == [
        ("prometheus-data", "/prometheus")]


def test_monitoring_without_a_pinned_prometheus_is_refused_naming_the_pin():
    write_lock({"CPU_IMAGE": IMAGE, "PROMETHEUS_IMAGE": ""})  # the profile's image only
    with pytest.raises(UsageError) as refused:
        configure(plan_of("cpu-tiny"), Settings(), monitoring=True)
    message = str(refused.value)
    assert message.startswith("PROMETHEUS_IMAGE='': has no image digest")
    assert "make pin IMAGE=repo:tag SOURCE=prometheus" in message

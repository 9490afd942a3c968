"""The monitoring compose profile as `make configure MONITORING=1` writes it and the real Compose
binary resolves it: Prometheus on 127.0.0.1 only, scraping every vLLM server of the project with
the API key's file, data in its own volume, and nothing of it without the profile. The real
Prometheus scrapes the real engine in `make e2e` (tests/e2e/steps/monitoring.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from launch.compose_config import compose_document, configure
from launch.errors import UsageError
from launch.image_lock import write_lock
from launch.settings import Settings
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
    # without the profile, compose runs no Prometheus
    plain = configure(plan_of("cpu-tiny"), Settings()).values
    assert "COMPOSE_PROFILES" not in plain
    assert "prometheus" not in config_of({**plain, "IMAGE": IMAGE})["services"]


def test_replicas_are_scraped_each(pinned):
    result = configure(plan_of("cpu-tiny"), Settings(), replicas=2, monitoring=True)
    assert result.values["PROMETHEUS_TARGETS"] == "vllm-0:8000,vllm-1:8000"
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
    assert {"vllm-0", "vllm-1", "router", "prometheus"} <= set(resolved["services"])
    assert "targets: [vllm-0:8000,vllm-1:8000]" in resolved["configs"]["prometheus"]["content"]


def test_monitoring_without_a_pinned_prometheus_is_refused_naming_the_pin():
    write_lock({"CPU_IMAGE": IMAGE})  # the profile's image is pinned, Prometheus is not
    with pytest.raises(UsageError) as refused:
        configure(plan_of("cpu-tiny"), Settings(), monitoring=True)
    message = str(refused.value)
    assert message.startswith("PROMETHEUS_IMAGE='': has no image digest")
    assert "make pin IMAGE=repo:tag SOURCE=prometheus" in message

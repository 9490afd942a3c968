"""One settings source: a value written only in compose/.env reaches every command that uses it,
and the test suite does not depend on what a user wrote there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launch.compose_env import ENV_FILE_VAR
from launch.image_lock import LOCK_VAR
from tests.conftest import REPO

OTHER_IMAGE = "registry.example/kit/glm53@sha256:" + "ab" * 32


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=REPO,
                          env=dict(os.environ), capture_output=True, text=True,
                          timeout=120)  # fmt: skip


@pytest.fixture
def env_file(hermetic_settings: Path):
    """Write lines into this test's compose/.env (the settings file the commands read)."""

    def write(*lines: str) -> None:
        (hermetic_settings / ".env").write_text("".join(f"{x}\n" for x in lines), "utf-8")

    return write


def test_render_compose_publishes_host_port_and_bind_address_from_compose_env(env_file):
    """Before, `render --format compose` read them from the environment only."""
    env_file("HOST_PORT=9100", "BIND_ADDRESS=0.0.0.0")
    done = launch("render", "cpu-tiny", "--format", "compose", "--replicas", "2")
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert services["router"]["ports"] == ["0.0.0.0:9100:8000"]
    assert services["vllm-0"]["ports"] == ["0.0.0.0:9101:8000"]


@pytest.mark.usefixtures("engine_unreachable")
def test_image_from_compose_env_reaches_configure_render_and_the_plan(env_file):
    """Before, `render --format k8s` took IMAGE from the environment only."""
    env_file(f"IMAGE={OTHER_IMAGE}")
    configured = launch("configure", "mtp3-tp4-split", "--dry-run")
    assert f"IMAGE={OTHER_IMAGE}" in configured.stdout.splitlines(), configured.stderr
    k8s = launch("render", "mtp3-tp4-split", "--format", "k8s", "--no-router")
    pods = [d for d in yaml.safe_load_all(k8s.stdout) if d and d.get("kind") == "StatefulSet"]
    assert pods and pods[0]["spec"]["template"]["spec"]["containers"][0]["image"] == OTHER_IMAGE
    plan = json.loads(launch("render", "mtp3-tp4-split", "--json").stdout)
    assert plan["image"] == (
        f"qualified-split (IMAGE from the environment or compose/.env): {OTHER_IMAGE}")


@pytest.mark.usefixtures("engine_unreachable")
def test_doctor_checks_the_host_port_compose_will_publish(env_file):
    """Before, the doctor checked the profile's in-container port (8000), not HOST_PORT."""
    env_file("HOST_PORT=9137")
    done = launch("doctor", "cpu-tiny")
    assert "API port 9137" in done.stdout, done.stdout + done.stderr


def test_the_bench_receipt_names_the_image_compose_ran(env_file):
    """Before, the receipt resolved IMAGE from the environment only."""
    from launch.settings import read_settings
    from serving.receipt import image_record

    env_file(f"IMAGE={OTHER_IMAGE}")
    assert image_record("kit", read_settings())["ref"] == OTHER_IMAGE


def test_smoke_asks_the_host_port_compose_publishes(env_file):
    from launch.settings import read_settings

    env_file("HOST_PORT=9222")
    assert read_settings().url(8000) == "http://127.0.0.1:9222"


HOSTILE = """\
PROFILE=dflash-tp4-dcp4
MAX_NUM_SEQS=7
HOST_PORT=9000
BIND_ADDRESS=0.0.0.0
GPU_DEVICES=4,5,6,7
IMAGE=registry.example/elsewhere@sha256:{digest}
KV_CACHE_MEMORY=none
GPU_MEMORY_UTILIZATION=0.5
REASONING_PARSER=none
FALLBACKS=attention_backend
""".format(digest="cd" * 32)
"""What a user's compose/.env may well hold: every line changes a plan the tests check."""
PLANNING_TESTS = ("tests/test_profiles.py", "tests/test_validation.py",
                  "tests/test_compose_env.py", "tests/test_glm_api.py")  # fmt: skip


@pytest.mark.usefixtures("engine_unreachable")
def test_the_planning_tests_pass_with_a_users_compose_env_present(tmp_path):
    """The suite's planning tests in a copy of the checkout whose compose/.env holds a user's
    overrides (before: 26 of them failed with MAX_NUM_SEQS=7 and HOST_PORT=9000 there)."""
    copy = tmp_path / "kit"
    ignore = shutil.ignore_patterns(".git", ".venv", ".venv-kit", "__pycache__", "build",
                                    "results", ".pytest_cache", ".ruff_cache")  # fmt: skip
    shutil.copytree(REPO, copy, ignore=ignore)
    (copy / "compose" / ".env").write_text(HOSTILE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in (ENV_FILE_VAR, LOCK_VAR)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *PLANNING_TESTS], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout
    imported = subprocess.run([sys.executable, "-c", "import launch; print(launch.__file__)"],
                              cwd=copy, env=env, capture_output=True, text=True, check=True)
    assert imported.stdout.startswith(str(copy))  # the copy's kit ran, not the checkout's

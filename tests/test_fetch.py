"""`make fetch`: the profile's Hub repositories, downloaded at their pinned revisions, verified
against the Hub's tree, resumed, and checked before `make up`.

`python -m launch.weights` runs as it runs in the fetch container (a process with HF_HOME and
HF_ENDPOINT set) against tests/hub_standin.py, a stand-in for the Hub (not reachable here) that
huggingface_hub 2.4 downloads from with its real code: tree listing, HEAD metadata, range resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.compose_env import compose_env_args
from launch.loader import load
from launch.weights import (
    HubFile,
    WeightRepo,
    bytes_to_fetch,
    check,
    parse_spec,
    record_path,
    too_big,
    weight_repos,
)
from tests.conftest import DOCKER_ENGINE
from tests.hub_standin import HubRepo, HubStandin, flipped

pytestmark = DOCKER_ENGINE  # compose makes and removes volumes of the glm53 project

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT = "520de24eabf507659eaef7c70f14fd584527facc"
REPO_ID = "kit-test/GLM-tiny"
WEIGHTS = bytes(range(256)) * 100_000
"""25.6 MB: huggingface_hub writes in 10 MiB chunks, so a cut after 15 MB leaves one on disk."""
CUT_AT = 15_000_000
CONFIG = b'{"architectures": ["Glm5NextForConditionalGeneration"]}\n'


@pytest.fixture
def hub() -> Iterator[tuple[HubStandin, str]]:
    files = {"config.json": CONFIG, "model.safetensors": WEIGHTS, "sub/tokenizer.json": b"{}"}
    standin = HubStandin({REPO_ID: HubRepo(REPO_ID, COMMIT, files)})
    server, url = standin.serve()
    yield standin, url
    server.shutdown()


def weights(url: str, home: Path, *args: str, token: str | None = None):
    env = {**os.environ, "HF_HOME": str(home), "HF_ENDPOINT": url,
           "HF_HUB_DISABLE_XET": "1", "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)
    env["HF_TOKEN_PATH"] = str(home / "hf_token")  # as compose mounts the secret: a file
    if token:
        (home / "hf_token").write_text(token + "\n")
    return subprocess.run([sys.executable, "-m", "launch.weights", *args], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def spec(revision: str = COMMIT) -> str:
    return f"model={REPO_ID}@{revision}"


def snapshot_file(home: Path, name: str) -> Path:
    return home / "hub" / "models--kit-test--GLM-tiny" / "snapshots" / COMMIT / name


def test_the_profiles_name_their_model_and_draft_at_the_pinned_commits() -> None:
    dflash = load("dflash-tp4-dcp4").profile
    assert weight_repos(dflash) == [
        WeightRepo("model", dflash.engine.model, dflash.engine.revision),
        WeightRepo("draft", dflash.engine.speculative_config.model,
                   dflash.engine.speculative_config.revision),
    ]  # fmt: skip
    mtp = load("mtp3-tp4-split").profile
    assert [r.role for r in weight_repos(mtp)] == ["model"]  # MTP heads live in the model
    assert weight_repos(load("cpu-tiny").profile) == []  # a directory in the image


def test_a_spec_that_is_not_role_repo_at_revision_is_refused() -> None:
    assert parse_spec(spec()) == WeightRepo("model", REPO_ID, COMMIT)
    for bad in (f"{REPO_ID}@{COMMIT}", f"target={REPO_ID}@{COMMIT}", "model=GLM@abc"):
        with pytest.raises(Exception, match="ROLE=ORG/NAME@REVISION"):
            parse_spec(bad)


def test_download_verifies_every_file_and_records_it(hub, tmp_path: Path) -> None:
    standin, url = hub
    done = weights(url, tmp_path, "download", spec())
    assert done.returncode == 0, done.stderr
    assert "3 files" in done.stdout and "verified" in done.stdout
    assert snapshot_file(tmp_path, "model.safetensors").read_bytes() == WEIGHTS
    record = json.loads(record_path(tmp_path, parse_spec(spec())).read_text())
    assert record["commit"] == COMMIT
    assert record["files"] == {"config.json": len(CONFIG), "model.safetensors": len(WEIGHTS),
                               "sub/tokenizer.json": 2}  # fmt: skip
    assert weights(url, tmp_path, "check", spec()).returncode == 0
    # a second run downloads nothing again
    before = len(standin.gets("model.safetensors"))
    assert weights(url, tmp_path, "download", spec()).returncode == 0
    assert len(standin.gets("model.safetensors")) == before == 1


def test_a_cut_transfer_resumes_with_a_range_request(hub, tmp_path: Path) -> None:
    standin, url = hub
    standin.cut_once["model.safetensors"] = CUT_AT
    done = weights(url, tmp_path, "download", spec())
    assert done.returncode == 0, done.stderr
    ranges = standin.gets("model.safetensors")
    assert ranges[0] == "" and len(ranges) == 2
    resumed_at = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= CUT_AT
    data = snapshot_file(tmp_path, "model.safetensors").read_bytes()
    assert hashlib.sha256(data).digest() == hashlib.sha256(WEIGHTS).digest()


def test_a_failed_run_keeps_finished_files_and_the_next_run_completes(hub, tmp_path: Path) -> None:
    standin, url = hub
    standin.broken.add("model.safetensors")
    failed = weights(url, tmp_path, "download", spec())
    assert failed.returncode == 1
    assert "run `make fetch` again" in failed.stderr
    assert snapshot_file(tmp_path, "config.json").read_bytes() == CONFIG
    missing = weights(url, tmp_path, "check", spec())
    assert missing.returncode == 1 and "has not been fetched" in missing.stdout
    standin.broken.clear()
    assert weights(url, tmp_path, "download", spec()).returncode == 0
    assert len(standin.gets("config.json")) == 1  # not fetched again
    assert weights(url, tmp_path, "check", spec()).returncode == 0


def test_bytes_that_do_not_match_the_hub_are_named_and_removed(hub, tmp_path: Path) -> None:
    standin, url = hub
    standin.corrupt.add("model.safetensors")
    bad = weights(url, tmp_path, "download", spec())
    assert bad.returncode == 1
    served = hashlib.sha256(flipped(WEIGHTS)).hexdigest()
    assert f"model.safetensors has sha256 {served}, the Hub says" in bad.stderr
    assert hashlib.sha256(WEIGHTS).hexdigest() in bad.stderr
    assert not snapshot_file(tmp_path, "model.safetensors").exists()
    assert not record_path(tmp_path, parse_spec(spec())).exists()
    standin.corrupt.clear()
    assert weights(url, tmp_path, "download", spec()).returncode == 0


def test_a_revision_the_hub_does_not_have_exits_2_naming_the_field(hub, tmp_path: Path) -> None:
    _, url = hub
    other = "0" * 40
    done = weights(url, tmp_path, "download", spec(other))
    assert done.returncode == 2
    assert f"engine.revision='{other}': the Hub has no such revision in {REPO_ID}" in done.stderr
    assert "MODEL_REVISION" in done.stderr
    draft = weights(url, tmp_path, "download", f"draft={REPO_ID}@{other}")
    assert "engine.speculative_config.revision" in draft.stderr
    assert "DFLASH_MODEL_REVISION" in draft.stderr


def test_a_gated_repository_asks_for_hf_token(hub, tmp_path: Path) -> None:
    standin, url = hub
    standin.repos[REPO_ID].gated = True
    refused = weights(url, tmp_path, "download", spec())
    assert refused.returncode == 2 and "compose/secrets/hf_token" in refused.stderr
    assert weights(url, tmp_path, "download", spec(), token="hf_test").returncode == 0


def test_a_byte_flipped_after_verification_is_found_and_that_file_alone_fetched_again(
    hub, tmp_path: Path
) -> None:
    standin, url = hub
    assert weights(url, tmp_path, "download", spec()).returncode == 0
    blob = snapshot_file(tmp_path, "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[1_000_000] ^= 0x01
    blob.write_bytes(bytes(data))
    assert weights(url, tmp_path, "check", spec()).returncode == 0  # sizes only: same size
    verified = weights(url, tmp_path, "verify", spec())
    assert verified.returncode == 1
    assert verified.stdout.startswith(f"not fetched: {REPO_ID}@{COMMIT}: model.safetensors "
                                      "changed since it was verified")  # fmt: skip
    again = weights(url, tmp_path, "download", spec())
    assert again.returncode == 0, again.stderr
    assert "1 file(s) failed verification and were removed" in again.stdout
    assert len(standin.gets("model.safetensors")) == 2 and len(standin.gets("config.json")) == 1
    assert weights(url, tmp_path, "verify", spec()).returncode == 0


def test_bytes_to_fetch_counts_what_the_cache_lacks_partial_transfers_included(
    hub, tmp_path: Path
) -> None:
    _, url = hub
    done = weights(url, tmp_path, "download", spec())
    assert done.returncode == 0, done.stderr
    assert f"downloading {len(CONFIG) + len(WEIGHTS) + 2:,} bytes" in done.stdout
    blobs = tmp_path / "hub" / "models--kit-test--GLM-tiny" / "blobs"
    tree = hub_tree_of(url)
    assert bytes_to_fetch(tree, blobs) == 0
    model = blobs / tree["model.safetensors"].hexdigest
    model.rename(model.with_name(model.name + ".incomplete"))
    partial = model.with_name(model.name + ".incomplete")
    with partial.open("r+b") as fh:
        fh.truncate(CUT_AT)
    assert bytes_to_fetch(tree, blobs) == len(WEIGHTS) - CUT_AT
    repo = parse_spec(spec())
    assert too_big(repo, 10, 10, tmp_path) is None
    refused = too_big(repo, 25_600_000, 1_048_576, tmp_path / "hub")
    assert refused is not None
    assert "needs 25,600,000 bytes more (0.02 GiB)" in refused
    assert "which has 1,048,576 bytes free" in refused and "HF_CACHE_VOLUME" in refused


def hub_tree_of(url: str) -> dict:
    """The stand-in's tree through `hub_tree` (huggingface_hub's own client) in a fresh
    interpreter, since huggingface_hub fixes its endpoint at import."""
    code = ("import json; from launch.weights import hub_tree, parse_spec; "
            f"tree = hub_tree(parse_spec({spec()!r})); "
            "print(json.dumps({k: vars(v) for k, v in tree.items()}))")  # fmt: skip
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_DISABLE_XET": "1",
           "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout  # fmt: skip
    return {k: HubFile(**v) for k, v in json.loads(out).items()}


def test_check_notices_a_file_removed_after_verification(hub, tmp_path: Path) -> None:
    _, url = hub
    assert weights(url, tmp_path, "download", spec()).returncode == 0
    snapshot_file(tmp_path, "sub/tokenizer.json").unlink()
    assert check(parse_spec(spec()), tmp_path) == (
        f"{REPO_ID}@{COMMIT}: sub/tokenizer.json is missing or changed since it was verified"
    )


def launch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PROFILE", "MODEL_REVISION")}
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=REPO_ROOT,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_make_fetch_runs_the_fetch_service_with_the_profile_repositories() -> None:
    done = launch("fetch", "dflash-tp4-dcp4", "--dry-run")
    assert done.returncode == 0, done.stderr
    p = load("dflash-tp4-dcp4").profile
    spec_ = p.engine.speculative_config
    # the tests' own settings file (conftest), which compose gets with --env-file
    compose = shlex.join(["docker", "compose", *compose_env_args()])
    assert done.stdout.strip().endswith(
        f"{compose} run --rm fetch download "
        f"model={p.engine.model}@{p.engine.revision} draft={spec_.model}@{spec_.revision}"
    )
    check_cmd = launch("fetch", "dflash-tp4-dcp4", "--check", "--dry-run")
    assert f"{compose} run --rm -T fetch verify model=" in check_cmd.stdout


def test_make_fetch_refuses_bad_input_before_docker() -> None:
    done = launch("fetch", "dflash-tp4-dcp4", env={"MODEL_REVISION": "main"})
    assert done.returncode == 2
    assert "engine.revision='main'" in done.stderr and "docker compose" not in done.stdout


def test_a_profile_serving_a_directory_has_nothing_to_fetch() -> None:
    done = launch("fetch", "cpu-tiny")
    assert done.returncode == 0
    assert "a directory in its image: nothing to fetch" in done.stdout


def docker_volumes() -> set[str]:
    listed = subprocess.run(["docker", "volume", "ls", "--quiet"], capture_output=True,
                            text=True, check=True)  # fmt: skip
    return set(listed.stdout.split())


UNPULLABLE = "127.0.0.1:9/glm53/nothing@sha256:" + "0" * 64
"""A digest reference no registry serves (nothing listens on port 9): compose cannot pull it."""


def test_a_check_that_could_not_run_is_not_reported_as_missing_weights(capsys):
    """Against the real Docker engine and compose: the profile's image cannot be pulled, so the
    fetch service never ran. `up`'s pre-check says it could not check (before, it printed an
    empty `warning:` and then claimed the weights were missing); `fetch --check` exits 2."""
    from launch.compose_config import configure, write
    from launch.settings import Settings
    from launch.weights_service import warn_if_missing
    from tests.conftest import plan_of

    env = {"IMAGE": UNPULLABLE}
    result = configure(plan_of("mtp3-tp4-split", env), Settings(environ=env))
    write(result)
    before = docker_volumes()
    try:
        warn_if_missing(result)
        done = launch("fetch", "mtp3-tp4-split", "--check", env={"IMAGE": UNPULLABLE})
    finally:  # compose makes the service's volumes before it tries to pull: the test's own
        made = docker_volumes() - before
        if made:
            subprocess.run(["docker", "volume", "rm", *sorted(made)], check=True,
                           capture_output=True)  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("warning: the weights check could not run (exit 1): ")
    assert "127.0.0.1:9" in err and "whether the weights are fetched was not checked" in err
    assert "will download them itself" not in err
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: the weights check could not run")

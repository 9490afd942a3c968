"""`make pin` end to end against a real OCI registry on 127.0.0.1 (Debian's docker-registry).

Tiny images are made with umoci and pushed with skopeo; the registry is started and stopped by
the fixture. The digest `pin` writes must be the one the registry reports to skopeo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import DOCKER_ENGINE, REPO, free_port, server_on_free_port

pytestmark = DOCKER_ENGINE  # real image builds, pushes and logins


def serve_registry(tmp_path: Path, auth: str = "") -> Iterator[str]:
    config = tmp_path / "registry.yml"

    def argv(port: int) -> list[str]:
        config.write_text(
            "version: 0.1\n"
            f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
            f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
        )
        return ["docker-registry", "serve", str(config)]

    with server_on_free_port(argv, lambda port: f"http://127.0.0.1:{port}/v2/", timeout=20,
                             auth=("kit", PASSWORD) if auth else None) as port:  # fmt: skip
        yield f"127.0.0.1:{port}"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    yield from serve_registry(tmp_path)


PASSWORD = "kit-secret-7"


@pytest.fixture
def private_registry(tmp_path: Path) -> Iterator[str]:
    """The same registry with htpasswd authentication (user `kit`), as a team's private one."""
    import bcrypt

    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"kit:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt()).decode()}\n")
    yield from serve_registry(
        tmp_path, f"auth:\n  htpasswd:\n    realm: kit-test\n    path: {htpasswd}\n"
    )


def push(tmp_path: Path, ref: str, env_value: str, creds: str | None = None) -> str:
    """Make a tiny distinct image with umoci, push it with skopeo, return the registry's digest."""
    layout = tmp_path / f"layout-{env_value}"
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", f"{layout}:t"], check=True)
    subprocess.run(["umoci", "config", "--image", f"{layout}:t", f"--config.env=KIT={env_value}"],
                   check=True)  # fmt: skip
    login = ["--dest-creds", creds] if creds else []
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", *login,
                    f"oci:{layout}:t", f"docker://{ref}"], check=True)  # fmt: skip
    inspect = subprocess.run(["skopeo", "inspect", "--tls-verify=false",
                              *(["--creds", creds] if creds else []), f"docker://{ref}"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(inspect.stdout)["Digest"]


def pin(lock: Path, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    argv = [sys.executable, "-m", "launch", "pin", *args, "--lock", str(lock)]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, **(env or {})})  # fmt: skip


@pytest.fixture
def lock(tmp_path: Path) -> Path:
    path = tmp_path / "images.lock"
    path.write_text("# test lock\nKIT_IMAGE=\nQUALIFIED_IMAGE=\n")
    return path


def test_tag_resolves_to_the_digest_the_registry_reports(tmp_path, registry, lock):
    digest = push(tmp_path, f"{registry}/kit/tiny:v1", "one")
    result = pin(lock, f"{registry}/kit/tiny:v1", "--source", "kit")
    assert result.returncode == 0, result.stderr
    assert f"KIT_IMAGE={registry}/kit/tiny@{digest}\n" in lock.read_text()
    assert lock.read_text().startswith("# test lock\n")


def test_a_private_registry_is_pinned_with_the_users_docker_login(tmp_path, private_registry,
                                                                 lock):  # fmt: skip
    """The real `docker login` (the engine `.ci/run` starts checks the password) writes the
    credentials where the Docker CLI keeps them; `make pin` uses them. Without a login the
    refusal names `docker login`, and nothing is written."""
    ref = f"{private_registry}/kit/private:v1"
    digest = push(tmp_path, ref, "one", creds=f"kit:{PASSWORD}")
    config = {"DOCKER_CONFIG": str(tmp_path / "docker-config")}
    anonymous = pin(lock, ref, env=config)
    assert anonymous.returncode == 2
    assert anonymous.stderr.startswith(f"error: IMAGE='{ref}': registry {private_registry} "
                                       "refused a request without a login (HTTP 401).")  # fmt: skip
    assert f"`docker login {private_registry}`" in anonymous.stderr
    assert "@" not in lock.read_text()
    login = subprocess.run(["docker", "login", private_registry, "--username", "kit",
                            "--password-stdin"], input=PASSWORD, capture_output=True, text=True,
                           env={**os.environ, **config}, timeout=60, check=False)  # fmt: skip
    assert login.returncode == 0, login.stderr
    result = pin(lock, ref, env=config)
    assert result.returncode == 0, result.stderr
    assert f"KIT_IMAGE={private_registry}/kit/private@{digest}\n" in lock.read_text()


def test_without_manifest_media_types_the_registry_answers_404(tmp_path, registry):
    push(tmp_path, f"{registry}/kit/tiny:v1", "one")
    bare = requests.get(f"http://{registry}/v2/kit/tiny/manifests/v1", timeout=5)
    assert bare.status_code == 404


def test_missing_tag_fails_clearly_and_writes_nothing(tmp_path, registry, lock):
    push(tmp_path, f"{registry}/kit/tiny:v1", "one")
    before = lock.read_text()
    result = pin(lock, f"{registry}/kit/tiny:nope")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"error: IMAGE='{registry}/kit/tiny:nope': tag not found on {registry}."
    )
    assert lock.read_text() == before


def test_repushed_tag_is_detected_as_a_changed_digest(tmp_path, registry, lock):
    ref = f"{registry}/kit/tiny:v1"
    first = push(tmp_path, ref, "one")
    assert pin(lock, ref).returncode == 0
    assert pin(lock, ref, "--check").returncode == 0
    second = push(tmp_path, ref, "two")
    assert second != first
    check = pin(lock, ref, "--check")
    assert check.returncode == 1
    assert f"{registry}/kit/tiny:v1 moved: {first} -> {second} (the tag was re-pushed)" in (
        check.stdout
    )
    assert f"@{first}" in lock.read_text()
    repin = pin(lock, ref)
    assert repin.returncode == 0 and "moved:" in repin.stdout
    assert f"KIT_IMAGE={registry}/kit/tiny@{second}\n" in lock.read_text()


def test_unreachable_registry_and_bad_refs_exit_2(lock):
    port = free_port()
    assert pin(lock, f"127.0.0.1:{port}/kit/tiny:v1", "--timeout", "2").returncode == 2
    assert pin(lock, "kit/tiny").returncode == 2
    assert pin(lock, "kit/tiny@sha256:" + "0" * 64).returncode == 2


def test_a_locally_built_image_is_pinned_by_its_image_id(tmp_path, lock):
    """Against the real engine `.ci/run` starts: an image built here and never pushed."""
    from launch.docker_api import connect, require_local_image
    from launch.errors import UsageError
    from launch.image_lock import read_lock, resolve_image

    try:
        connect("skip")
    except UsageError as err:
        pytest.fail(f"no Docker engine answers ({err}); the kit's tests need one: "
                    "`python tests/e2e/services.py start --state DIR` starts it")
    context = tmp_path / "context"
    context.mkdir()
    (context / "marker").write_text(str(tmp_path))
    (context / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
    tag = f"glm53-local-pin-test:{tmp_path.name.lower()}"
    subprocess.run(["docker", "build", "--quiet", "--tag", tag, str(context)], check=True,
                   env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"},
                   capture_output=True, timeout=120)  # fmt: skip
    try:
        inspect = ["docker", "image", "inspect", "--format", "{{.Id}}", tag]
        shown = subprocess.run(inspect, capture_output=True, text=True, check=True)
        image_id = shown.stdout.strip()
        done = pin(lock, tag, "--source", "cpu", "--local")
        assert done.returncode == 0, done.stderr
        assert read_lock(lock)["CPU_IMAGE"] == image_id
        assert pin(lock, tag, "--source", "cpu", "--local", "--check").returncode == 0
        # compose on this engine runs it; a cluster or a build cannot pull it
        assert resolve_image("cpu", {}, lock) == image_id
        with pytest.raises(UsageError) as err:
            resolve_image("cpu", {}, lock, local_ok=False)
        assert "is a local image ID" in err.value.rule and "make pin" in err.value.fix
        require_local_image(image_id)
    finally:
        subprocess.run(["docker", "image", "rm", "--force", tag], capture_output=True, check=True)
    with pytest.raises(UsageError) as err:
        require_local_image(image_id)
    assert "this Docker engine has no such image" in err.value.rule
    gone = pin(lock, tag, "--source", "cpu", "--local")
    assert gone.returncode == 2
    assert "is not an image on this Docker engine" in gone.stderr
    assert pin(lock, "debian:bookworm", "--source", "base", "--local").returncode == 2

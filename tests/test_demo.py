"""`make demo`'s edges that need no engine: a host whose Docker engine does not answer gets the
usual error naming the socket and the fix (exit 2) with nothing pinned or started; the `curl`
line it prints is one the shell runs, with the key's header only when a key is set; a smoke is
reused only for the very container start it passed on; a bad `--base-id` is refused before any
build. The whole demo runs on the real engine in `make e2e` (tests/e2e/steps/demo.py)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest

from launch.demo import curl_line, remember_smoke, smoke_passed
from launch.image_lock import read_lock
from launch.settings import read_settings
from tests.conftest import REPO, launch_cli


@pytest.mark.usefixtures("engine_unreachable")
def test_no_engine_exits_2_naming_the_socket_and_nothing_is_pinned():
    before = read_lock()
    done = launch_cli("demo")
    assert done.returncode == 2, done.stderr
    assert "docker engine='unix://" in done.stderr and "Fix: start dockerd" in done.stderr
    assert read_lock() == before


def test_a_bad_wait_is_refused_naming_the_option():
    done = launch_cli("demo", "--healthy-within", "-5")
    assert done.returncode == 2 and "--healthy-within" in done.stderr


def test_the_curl_line_runs_in_a_shell_and_carries_the_key_only_when_set(tmp_path, monkeypatch):
    without = curl_line(read_settings(()), "kit-tiny-chat")
    argv = shlex.split(without)
    assert argv[:3] == ["curl", "-s", "http://127.0.0.1:8000/v1/chat/completions"]
    assert '"model": "kit-tiny-chat"' in argv[-1] and "Authorization" not in without
    key = tmp_path / "key"
    key.write_text("sk-demo\n", encoding="utf-8")
    monkeypatch.setenv("KIT_API_KEY_FILE", str(key))
    keyed = curl_line(read_settings(()), "kit-tiny-chat")
    assert f'-H "Authorization: Bearer $(cat {key})"' in keyed and "sk-demo" not in keyed
    shown = subprocess.run(["bash", "-c", f"printf '%s\\n' {keyed.removeprefix('curl ')}"],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "Authorization: Bearer sk-demo" in shown.splitlines()


def container(cid: str, started: str) -> SimpleNamespace:
    """A stand-in for a Docker SDK container holding the two fields the demo's record reads
    (`id`, `attrs["State"]["StartedAt"]`): a restart or another server is what the engine here
    cannot be asked to show within a unit test; the e2e's AGAIN step reads a real one."""
    return SimpleNamespace(id=cid, attrs={"State": {"StartedAt": started}})


def test_a_smoke_counts_only_for_the_container_start_it_passed_on():
    first = container("abc", "2026-12-03T22:00:00Z")
    assert smoke_passed(first) is None
    remember_smoke(first)
    assert smoke_passed(container("abc", "2026-12-03T22:00:00Z")) is not None
    assert smoke_passed(container("abc", "2026-12-03T23:00:00Z")) is None  # restarted
    assert smoke_passed(container("def", "2026-12-03T22:00:00Z")) is None  # another server


@pytest.mark.parametrize("base", ["glm53-kit/debian:bookworm", "sha256:abc"])
def test_a_base_id_that_is_not_one_is_refused_before_any_build(base):
    done = subprocess.run([sys.executable, "docker/build.py", "--engine", "cpu", "--base-id",
                           base, "--dry-run"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"--base-id={base!r}: is not an image ID" in done.stderr

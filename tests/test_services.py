"""tests/e2e/services.py leaves the user's Compose plugin as it found it: a working plugin is
used as it is; a broken one is moved aside for the run and put back by `stop`; where there was
none, `stop` removes the link `start` made. The real docker CLI judges what works (a plugin must
answer its metadata call); HOME points at a temporary directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "e2e"))
import services

METADATA = json.dumps({"SchemaVersion": "0.1.0", "Vendor": "test", "Version": "v9.9.9"})


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    return tmp_path / "home"


def user_plugin(home: Path, *, works: bool) -> Path:
    plugin = home / ".docker" / "cli-plugins" / "docker-compose"
    plugin.parent.mkdir(parents=True)
    body = (f"if [ \"$1\" = docker-cli-plugin-metadata ]; then echo '{METADATA}'; fi\nexit 0\n"
            if works else "exit 1\n")  # fmt: skip
    plugin.write_text(f"#!/bin/sh\n{body}")
    plugin.chmod(0o755)
    return plugin


def test_a_working_plugin_is_left_alone(home, tmp_path):
    plugin = user_plugin(home, works=True)
    before = plugin.read_text()
    assert services.link_compose_plugin(tmp_path).endswith("(left alone)")
    assert services.restore_compose_plugin(tmp_path) is None
    assert not plugin.is_symlink() and plugin.read_text() == before


def test_a_broken_plugin_is_moved_aside_and_put_back(home, tmp_path):
    plugin = user_plugin(home, works=False)
    before = plugin.read_text()
    services.link_compose_plugin(tmp_path)
    assert plugin.is_symlink() and plugin.resolve().name == "docker-compose"
    assert services.compose_answers()
    assert services.restore_compose_plugin(tmp_path) == f"{plugin} restored"
    assert not plugin.is_symlink() and plugin.read_text() == before


def test_without_a_plugin_stop_removes_the_link(home, tmp_path):
    plugin = home / ".docker" / "cli-plugins" / "docker-compose"
    services.link_compose_plugin(tmp_path)
    assert plugin.is_symlink()
    assert services.restore_compose_plugin(tmp_path) == f"{plugin} removed"
    assert not plugin.exists() and not plugin.is_symlink()

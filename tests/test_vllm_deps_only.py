"""The launcher's run path and the geometry plugin import only what the installed vLLM requires.

A qualified runtime image runs `python3 -m launch run` with its own Python and the kit mounted at
/opt/kit: nothing of the kit's own dependencies is installed there. Each test runs the real
command under docker/vllm_deps_only.py, which makes every module outside the installed vLLM
0.33.0's dependency closure (computed from its metadata) absent for the kit's code. The same
guard runs inside the CUDA image in its self-check (docker/selfcheck.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch.loader import profile_names

REPO = Path(__file__).resolve().parent.parent
GUARD = REPO / "docker" / "vllm_deps_only.py"
pytestmark = pytest.mark.vllm

DCP1 = {"DCP": "1", "CP_KV_CACHE_INTERLEAVE_SIZE": "1"}
"""dflash on vLLM 0.33.0: its draft cannot stay replicated under DCP 4 (refused whatever
FALLBACKS says), so the dry run that must reach the end plans it at DCP 1."""


def guarded(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GUARD), *args],
        cwd=REPO,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("profile", profile_names())
def test_launch_run_dry_run_imports_only_vllm_dependencies(profile: str) -> None:
    """Every profile's `launch run --dry-run` reaches the rendered command under the guard; a
    refusal for a missing capability is answered with the FALLBACKS it names, so the whole run
    path (capability check, vLLM's own parser, the plugin's metadata) is imported."""
    env = dict(DCP1) if profile == "dflash-tp4-dcp4" else {}
    result = guarded("-m", "launch", "run", "--dry-run", profile, env=env)
    fallbacks = re.search(r"FALLBACKS=(\S+)", result.stderr)
    if result.returncode == 2 and fallbacks:
        result = guarded("-m", "launch", "run", "--dry-run", profile,
                         env={**env, "FALLBACKS": fallbacks.group(1)})  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "vllm serve" in result.stderr + result.stdout
    assert "made absent" not in result.stderr, result.stderr[-2000:]


def test_the_geometry_plugin_imports_only_vllm_dependencies() -> None:
    code = (
        "import importlib, pkgutil, kvgeometry\n"
        "for m in pkgutil.walk_packages(kvgeometry.__path__, 'kvgeometry.'):\n"
        "    importlib.import_module(m.name)\n"
        "kvgeometry.register()\n"
        "import vllm.v1.engine.core as core\n"
        "assert getattr(core.get_kv_cache_configs, '_kvgeometry_wrapped', False), 'not wrapped'\n"
    )
    result = guarded("-c", code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "made absent" not in result.stderr, result.stderr[-2000:]


def test_the_guard_makes_a_kit_dependency_absent() -> None:
    """The failure the guard exists to show: the Docker SDK (a kit dependency, installed in the
    test environment) imported by the kit's code, as launch/docker_api.py once did at module
    level, which ended every start on a runtime without it."""
    result = guarded("-c", "import docker.errors")
    assert result.returncode == 1
    assert "No module named 'docker'" in result.stderr
    assert "made absent for the kit" in result.stderr and "docker (imported by" in result.stderr


def test_the_closure_comes_from_vllms_metadata() -> None:
    """What vLLM 0.33.0 declares is in (pyyaml and requests directly, python-dotenv through
    `fastapi[standard]`), the kit's own extra dependencies are out."""
    sys.path.insert(0, str(GUARD.parent))
    try:
        from vllm_deps_only import allowed_modules, dependency_closure
    finally:
        sys.path.remove(str(GUARD.parent))
    closure = dependency_closure()
    assert {"pyyaml", "requests", "python-dotenv", "fastapi"} <= closure
    assert not {"docker", "nvidia-ml-py"} & closure
    allowed = allowed_modules()
    assert {"yaml", "requests", "dotenv", "json", "launch", "kvgeometry"} <= allowed
    assert "docker" not in allowed and "pynvml" not in allowed

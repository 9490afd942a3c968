"""Shared test helpers: paths to the shared fixtures and a vLLM tree with every fork capability."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parent.parent
FIXTURE_LOGS = REPO / "tests" / "fixtures" / "vllm-logs"
"""The project's shared real-server logs (`../shared/fixtures/vllm-logs`), copied unchanged into
the repository so that a clone anywhere runs the tests."""

# tests/planner runs in its own pytest process against the patched vLLM copy
# (`make test` sets KIT_PATCHED_VLLM and PYTHONPATH); one process cannot import two vLLMs.
collect_ignore = [] if os.environ.get("KIT_PATCHED_VLLM") else ["planner"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    """A vLLM package tree made of the installed vLLM 0.33.0's own registration files, with
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
    """vLLM 0.33.0's registration files with every fork knob the profiles use registered: the
    fork's environment names, the B12X sparse-MLA backend, the KDA decode key."""
    return registration_tree(
        tmp_path / "vllm", FORK_REGISTRATIONS, ("B12X_MLA_SPARSE",), ("glm53_kda_decode_backend",)
    )

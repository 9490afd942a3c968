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


@pytest.fixture
def fork_vllm_tree(tmp_path: Path) -> Path:
    """A minimal vLLM package tree whose source reads every fork knob the profiles use.

    It stands for the qualified fork image in capability checks: the check reads source text,
    so a tree that contains the names is what a fork that reads them looks like.
    """
    root = tmp_path / "vllm"
    registry = root / "v1" / "attention" / "backends"
    registry.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "_version.py").write_text("__version__ = version = '0.33.0+fork'\n")
    (registry / "registry.py").write_text(
        "class AttentionBackendEnum(Enum):\n    FLASH_ATTN = 'x'\n    B12X_MLA_SPARSE = 'y'\n"
    )
    (root / "envs.py").write_text(
        "B12X_PCIE_ALLREDUCE = os.getenv('B12X_PCIE_ALLREDUCE')\n"
        "DCP_CKV_GATHER = os.getenv('DCP_CKV_GATHER')\n"
        "T = os.getenv('VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE')\n"
        "M = os.getenv('VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE')\n"
        "K = additional_config.get('glm53_kda_decode_backend')\n"
    )
    # the parser registries are upstream's (the fork keeps them): the installed vLLM's files
    import vllm

    upstream = Path(vllm.__file__).parent
    for registry_file in ("reasoning/__init__.py", "tool_parsers/__init__.py"):
        (root / registry_file).parent.mkdir(parents=True, exist_ok=True)
        (root / registry_file).write_text((upstream / registry_file).read_text())
    return root

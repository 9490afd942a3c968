"""The patch series applies to pristine vLLM 0.34.0 files and fails loudly on a changed base."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.vllm_vocab import VLLM_VERSION
from tests.conftest import REPO

APPLY = REPO / "patches" / "apply_series.py"
FILES = (
    "_version.py",
    "__init__.py",
    "envs.py",
    "v1/core/kv_cache_planning.py",
    "platforms/interface.py",
)


@pytest.fixture
def pristine_tree(tmp_path: Path) -> Path:
    """The files the series touches, copied from the installed vllm wheel."""
    from launch.vllm_install import find_vllm

    install = find_vllm()
    assert install is not None and install.version == VLLM_VERSION
    root = tmp_path / "vllm"
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(install.root / rel, root / rel)
    return root


def apply(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(APPLY), *args], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def test_series_applies_in_order_and_leaves_its_markers(pristine_tree):
    result = apply("--vllm-root", str(pristine_tree))
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == [
        "applied 0001-align-replicated-draft-blocks.patch",
        "applied 0002-glm53-split-target-recurrent-pages.patch",
    ]
    check = apply("--vllm-root", str(pristine_tree), "--check")
    assert check.returncode == 0 and check.stdout.count("present ") == 2


def test_changed_base_names_the_patch_and_the_expected_version(pristine_tree):
    interface = pristine_tree / "platforms/interface.py"
    text = interface.read_text()
    context = "vllm_config.parallel_config\n\n        if cache_config.cache_dtype"
    assert text.count(context) == 1
    interface.write_text(text.replace(context, context.replace("\n\n", "\n        # changed\n")))
    result = apply("--vllm-root", str(pristine_tree))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"error: 0002-glm53-split-target-recurrent-pages.patch does not apply to the vLLM at "
        f"{pristine_tree} (found vllm {VLLM_VERSION}; the series is written against "
        f"vllm=={VLLM_VERSION})"
    )
    assert "\\n" not in result.stderr.splitlines()[0]


def test_check_on_an_unpatched_tree_fails(pristine_tree):
    result = apply("--vllm-root", str(pristine_tree), "--check")
    assert result.returncode == 1
    assert "0001-align-replicated-draft-blocks.patch is not applied" in result.stderr


def test_bad_usage_exits_2(tmp_path):
    assert apply().returncode == 2
    assert apply("--vllm-root", str(tmp_path)).returncode == 2


def test_pristine_vllm_refuses_the_split_variables_under_hard_fail(monkeypatch):
    """What patch 0002's registration in envs.py changes (the patched side is in tests/planner)."""
    from vllm.platforms.interface import Platform

    monkeypatch.setenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE", "512")
    with pytest.raises(ValueError, match=r"^Unknown vLLM environment variable detected: VLLM_"):
        Platform.validate_environ(hard_fail=True)

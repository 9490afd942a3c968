"""The e2e layer check (tests/e2e/run.py build_inputs_in_layers) finds what a build input would
leave behind: a tiny image built by the real engine `.ci/run` starts, with a wheel in one of its
layers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "e2e"))
from run import Run, StepFailed, build_inputs_in_layers


def test_a_wheel_left_in_an_earlier_layer_is_found(tmp_path: Path):
    context = tmp_path / "context"
    context.mkdir()
    (context / "torch-0-py3-none-any.whl").write_bytes(b"not really a wheel")
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY torch-0-py3-none-any.whl /tmp/\nCOPY Dockerfile /marker\n"
    )
    tag = f"kit-test-layers:{tmp_path.name.lower()[-20:]}"
    built = subprocess.run(["docker", "build", "--quiet", "--tag", tag, str(context)],
                           capture_output=True, text=True, timeout=300, check=False,
                           env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert built.returncode == 0, built.stderr
    try:
        with pytest.raises(StepFailed, match=r"tmp/torch-0-py3-none-any\.whl"):
            build_inputs_in_layers(Run(tmp_path, {}), tag)
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)

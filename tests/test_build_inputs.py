"""The e2e layer check (tests/e2e/steps/images.py build_inputs_in_layers) finds what a build
input would leave behind: a tiny image built by the real engine `.ci/run` starts, with a wheel in
one of its layers, read both ways the check reads layers (the engine's overlay2 directories, and
`docker save` where the engine stores them otherwise)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import DOCKER_ENGINE
from tests.e2e.harness import Run, StepFailed
from tests.e2e.steps import images
from tests.e2e.steps.images import build_inputs_in_layers

pytestmark = DOCKER_ENGINE  # real image builds


@pytest.mark.parametrize("source", ["overlay2 layer directories", "docker save"])
def test_a_wheel_left_in_an_earlier_layer_is_found(tmp_path: Path, source: str,
                                                   monkeypatch: pytest.MonkeyPatch):  # fmt: skip
    context = tmp_path / "context"
    context.mkdir()
    # content and a tag of its own: two workers that built the same layers shared them through
    # the build cache, and one's `image rm` deleted an image the other had just taken from it
    # (CI saw "failed to get digest"); a tag both used was removed by one while the other read it
    run_id = uuid.uuid4().hex[:16]
    (context / "torch-0-py3-none-any.whl").write_bytes(f"not really a wheel {run_id}".encode())
    (context / "Dockerfile").write_text(
        "FROM scratch\nCOPY torch-0-py3-none-any.whl /tmp/\nCOPY Dockerfile /marker\n"
    )
    tag = f"kit-test-layers:{run_id}"
    built = subprocess.run(["docker", "build", "--quiet", "--tag", tag, str(context)],
                           capture_output=True, text=True, timeout=300, check=False,
                           env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert built.returncode == 0, built.stderr
    if source == "docker save":
        monkeypatch.setattr(images, "overlay_layer_dirs", lambda tag: None)
    else:
        assert images.overlay_layer_dirs(tag), "the CI engine stores layers as overlay2"
    try:
        with pytest.raises(StepFailed, match=r"tmp/torch-0-py3-none-any\.whl"):
            build_inputs_in_layers(Run(tmp_path, {}), tag)
    finally:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True, check=False)

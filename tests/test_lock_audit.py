"""docker/lock_audit.py on the real wheels the locks name (PyPI's index, range reads of each
wheel's RECORD): the CUDA lock installs no path twice (but the two it accepts, each named) and
its nvcc is torch's CUDA; the pins the lock had before carried both defects, and the audit
names both."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "docker"))
from lock_audit import ACCEPTED_SHARED, audit


def test_the_cuda_lock_installs_no_path_twice_and_compiles_for_torchs_cuda():
    result = audit((REPO / "docker" / "requirements.lock").read_text(), (3, 13))
    assert result.no_wheel == []
    assert len(result.files) == 202
    assert set(result.shared_paths()) == set(ACCEPTED_SHARED)
    assert result.torch_cuda == "13.0" and result.nvcc.startswith("13.0.")
    assert result.findings() == []


def test_the_pins_before_issue_20_fail_by_name():
    lock = REPO / "tests" / "fixtures" / "requirements-before-issue-20.lock"
    out = subprocess.run([sys.executable, str(REPO / "docker" / "lock_audit.py"), str(lock),
                          "--python", "3.12"], capture_output=True, text=True, timeout=300,
                         check=False)  # fmt: skip
    assert out.returncode == 1
    findings = out.stderr.splitlines()
    assert findings[0].startswith("lock audit: cuda-bindings and cuda-python both install 28 ")
    assert "cuda/bindings/__init__.py" in findings[0]
    assert findings[1] == (
        "lock audit: nvidia-cuda-nvcc 13.5.37 is CUDA 13.5, torch was built for CUDA 13.0"
    )

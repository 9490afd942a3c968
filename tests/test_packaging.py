"""The kit as a wheel built from pyproject.toml (packages found, not listed), installed into a
fresh virtual environment and run from outside the checkout: every package is in it."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.conftest import REPO


def run(argv: list[str], cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def test_a_wheel_in_a_fresh_venv_runs_smoke_and_launch(tmp_path):
    built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
                 str(tmp_path / "dist"), str(REPO)], tmp_path)  # fmt: skip
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("glm53_serving_kit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("serving/bench/client.py", "kvgeometry/report.py", "launch/commands/run_cmd.py",
                   "launch/profiles/cpu-tiny.yaml"):  # fmt: skip
        assert module in names
    assert not any(n.startswith("tests/") for n in names)
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", str(venv)], tmp_path).returncode == 0
    python = str(venv / "bin" / "python")
    installed = run([python, "-m", "pip", "install", "--quiet", str(wheel)], tmp_path)
    assert installed.returncode == 0, installed.stderr
    smoke = run([python, "-m", "smoke", "check", "--help"], tmp_path)
    assert smoke.returncode == 0, smoke.stderr
    assert "--profile" in smoke.stdout
    listed = run([python, "-m", "launch", "list"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert {line.split()[0] for line in listed.stdout.splitlines()} == {
        "cpu-tiny", "dflash-tp4-dcp4", "mtp3-tp4-split"}  # fmt: skip

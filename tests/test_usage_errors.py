"""Input that once ended in a Python traceback ends in the kit's one error instead: one line
naming the field, the value, the rule and the fix, exit status 2, nothing started or written.
Each case is one that crashed before (the exception it raised is named beside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.conftest import launch_cli as launch

HUGE = "9" * 400


def one_usage_error(done: subprocess.CompletedProcess[str], field: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(f"error: {field}") and ". Fix: " in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("argv", [["list"], ["render", "cpu-tiny", "--format", "compose"],
                                  ["configure", "cpu-tiny", "--dry-run"]])  # fmt: skip
def test_a_host_port_that_is_no_number(argv):
    """Was: ValueError: invalid literal for int() with base 10: '80a' (an int() in an argparse
    default, so even `launch list` died)."""
    done = launch(*argv, env={"HOST_PORT": "80a"})
    if argv == ["list"]:  # list reads no settings: it must simply work
        assert done.returncode == 0 and "cpu-tiny" in done.stdout, done.stderr
        return
    assert "must be a TCP port, 1 to 65535 (from environment)" in one_usage_error(done, "HOST_PORT")


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_a_host_tier_size_that_is_not_finite(value):
    """Was: OverflowError: cannot convert float infinity to integer (inf), ValueError: cannot
    convert float NaN to integer (nan): the schema took non-finite floats. Now the size reader
    (launch/sizes.py) refuses them first."""
    done = launch("render", "mtp3-tp4-split",
                  env={"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": value})
    line = one_usage_error(done, "environment KV_OFFLOADING_SIZE_GB")
    assert "is not a size" in line


def test_a_context_length_of_four_hundred_digits_with_a_suffix():
    """Was: OverflowError (the `k` suffix went through a float)."""
    done = launch("render", "mtp3-tp4-split", env={"MAX_MODEL_LEN": HUGE + "k"})
    assert "(2^63 - 1, the largest integer" in one_usage_error(
        done, "environment MAX_MODEL_LEN (engine.max_model_len)")


def test_an_image_lock_that_does_not_exist(tmp_path):
    """Was: FileNotFoundError from `configure` (and `render` printed the plan as if no lock
    were asked for)."""
    missing = str(tmp_path / "nope.lock")
    for argv in (["configure", "cpu-tiny", "--dry-run"], ["render", "cpu-tiny"]):
        line = one_usage_error(launch(*argv, env={"KIT_IMAGES_LOCK": missing}), "KIT_IMAGES_LOCK")
        assert "cannot be read (No such file or directory)" in line


def test_a_settings_file_that_is_not_utf8(hermetic_settings: Path):
    """Was: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff."""
    (hermetic_settings / ".env").write_bytes(b"HOST_PORT=8000\nMAX_NUM_SEQS=\xff\xfe7\n")
    for argv in (["render", "cpu-tiny"], ["configure", "cpu-tiny"], ["doctor", "cpu-tiny"]):
        line = one_usage_error(launch(*argv), "KIT_ENV_FILE")
        assert "is not UTF-8 text (byte 0xff at offset 28)" in line
    assert b"written by" not in (hermetic_settings / ".env").read_bytes()  # nothing written


def test_recorded_outputs_in_utf16_are_read_and_binary_ones_refused(tmp_path, capsys,
                                                                    monkeypatch):  # fmt: skip
    """Was: UnicodeDecodeError on an `nvidia-smi` output saved by PowerShell (UTF-16 with a
    byte-order mark). It is text, so it is read; bytes that are no text are the kit's error.
    No Docker engine answers here (doctor says so): the socket it would ask does not exist."""
    from launch.__main__ import main

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    smi = (REPO / "tests" / "fixtures" / "host" / "nvidia-smi-580-2x-a100.txt").read_text()
    utf16 = tmp_path / "smi-utf16.txt"
    utf16.write_bytes(smi.encode("utf-16"))
    assert main(["doctor", "mtp3-tp4-split", "--nvidia-smi", str(utf16)]) == 2  # 2 A100s: FAIL
    out = capsys.readouterr().out
    assert "ok    NVIDIA driver" in out and "580.126.09" in out
    binary = tmp_path / "smi.bin"
    binary.write_bytes(b"\x80\x81\x82 not text")
    assert main(["doctor", "mtp3-tp4-split", "--nvidia-smi", str(binary)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --nvidia-smi='{binary}': is not UTF-8 or UTF-16 text")


@pytest.mark.parametrize("argv", [
    ["--set", "VLLM_EXTRA_ARGS=--seed \"7"], ["--set", "VLLM_EXTRA_ARGS=--seed 7 \\"],
])  # fmt: skip
def test_pass_through_arguments_that_a_shell_could_not_split(argv):
    """Was: ValueError: No closing quotation / No escaped character (shlex)."""
    line = one_usage_error(launch("render", "cpu-tiny", *argv), "--set VLLM_EXTRA_ARGS")
    assert "cannot be split as a shell would" in line


@pytest.mark.parametrize("value", ["100000000", "99999999999999999999"])
def test_a_mistyped_tensor_parallel_size_is_refused_at_once(value):
    """Was: 10 s and 3.9 GB building the GPU_DEVICES hint (range(TP)), and a MemoryError for
    a 20-digit TP."""
    done = launch("render", "mtp3-tp4-split", env={"TP": value})
    line = one_usage_error(done, "deployment.gpu_devices" if len(value) < 19
                           else "environment TP")  # fmt: skip
    assert len(line) < 600


def test_an_interrupted_fetch_is_reported_as_not_fetched(tmp_path):
    """Was: json.decoder.JSONDecodeError from `make fetch CHECK=1` when a fetch was cut while it
    wrote its verification record (written in place, read without a guard). The record is now
    written beside its place and renamed over it; one cut short counts as not verified."""
    from launch.weights import parse_spec, read_record, record_path, write_record

    repo = parse_spec("model=org/name@" + "a" * 40)
    path = record_path(tmp_path, repo)
    write_record(path, {"snapshot": str(tmp_path), "files": {}})
    assert read_record(path) == {"snapshot": str(tmp_path), "files": {}}
    assert not list(path.parent.glob("*.partial"))
    path.write_text(json.dumps({"snapshot": str(tmp_path), "files": {}})[:20])  # cut short
    env = {**os.environ, "HF_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "launch.weights", "check", repo.spec], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "its verification record" in done.stdout and "is unreadable" in done.stdout


@pytest.mark.parametrize(("argv", "said"), [
    (["check", "--timeout", "-5"], "argument --timeout: '-5' is not a number above 0 and at most "
     "86,400 (seconds)"),
    (["check", "--timeout", "1e9"], "'1e9' is not a number above 0 and at most 86,400"),
    (["check", "--concurrency", "0"], "argument --concurrency: '0' is not a whole number"),
    (["check", "--url", "ftp://x", "--no-log"], "--url='ftp://x': must be an http:// or"),
    (["bench", "--concurrency", "5000"], "5000 is above 4096 simultaneous streams"),
    (["bench", "--concurrency", "99999999999"], "'99999999999' is not a whole number from 1 to "
     "1,048,576"),
    (["bench", "--prefill-tokens", "9" * 30], "is not a whole number from 1 to 1,048,576"),
    (["bench", "--duration", "nan"], "argument --duration: 'nan' is not a number above 0"),
])  # fmt: skip
def test_smoke_numbers_and_urls_a_user_mistypes_are_usage_errors(argv, said):
    """Were: exit 1 as a failed check (--timeout -5, --url ftp://x), and a bench that started
    hundreds of thousands of tasks and never finished (--concurrency 99999999999)."""
    package = "smoke" if argv[0] == "check" else "serving"
    done = subprocess.run([sys.executable, "-m", package, *argv, "--profile", "cpu-tiny"],
                          cwd=REPO, env=dict(os.environ), capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr

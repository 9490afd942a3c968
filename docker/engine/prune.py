"""Remove what the locked wheels install that serving never loads, in the same RUN as the install.

Each path is listed with why nothing in the image loads it: no shared object of the image names
it (no ELF NEEDED, no dlopen string) and no Python module of the image imports or opens it; what
names it is a profiler or a catalogue. A path that is not there fails the build, so a new lock
that moves or drops one is noticed instead of leaving the image larger than it says.

    python prune.py            # in the image build (install-cuda.sh), on this interpreter's venv
    python prune.py --list     # what it removes and why, without removing
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
from pathlib import Path

UNUSED: dict[str, str] = {
    "triton/backends/nvidia/lib/cupti": "Triton's copy of CUPTI for its Proton profiler "
    "(triton/profiler, a knob in triton/knobs.py); torch's profiler uses the CUDA wheels' own",
    "triton/backends/nvidia/lib/cupti-blackwell": "the same profiler's Blackwell CUPTI",
    "nvidia/cu13/lib/libnvrtc.alt.so.13": "an alternative NVRTC build nothing in the image "
    "names; torch, FlashInfer and CuTe load libnvrtc.so.13",
    "nvidia/cu13/lib/libcusolverMg.so.12": "multi-GPU cuSOLVER; torch links libcusolver.so.12 "
    "alone, and only cuda-pathfinder's catalogue of library names lists it",
}
"""Paths under site-packages -> why serving does not need them."""


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def prune(root: Path) -> int:
    """Remove every UNUSED path under `root`; the bytes freed. SystemExit naming a missing one."""
    missing = [rel for rel in UNUSED if not (root / rel).exists()]
    if missing:
        raise SystemExit(f"prune: not in {root}: {', '.join(missing)} (the lock changed? update "
                         "docker/engine/prune.py)")  # fmt: skip
    freed = 0
    for rel in UNUSED:
        path = root / rel
        if path.is_dir():
            freed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        else:
            freed += path.stat().st_size
            path.unlink()
    return freed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print the paths and why, remove none")
    args = parser.parse_args(argv)
    if args.list:
        for rel, why in UNUSED.items():
            print(f"{rel}: {why}")
        return 0
    freed = prune(site_packages())
    print(f"pruned {len(UNUSED)} paths serving never loads: {freed / 2**20:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

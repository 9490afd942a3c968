"""Audit a hash-locked requirements file against the wheels it names, before anything installs.

Two defects a resolver does not see, both found in the CUDA lock once:
- two distributions shipping the same path (cuda-python 12.x and cuda-bindings 13.x both wrote
  `cuda/bindings/driver.so`, ...): whichever pip installs last wins and the tree is mixed;
- a CUDA compiler of another version than the runtime torch was built for (nvcc 13.5 beside
  torch's CUDA 13.0): CCCL's headers refuse the pair and the PTX is too new for the driver.

For each pin it picks the wheel whose SHA-256 the lock lists and whose tags this interpreter
target accepts (from the index's PEP 691 JSON), and reads only the wheel's `RECORD` (and torch's
`torch/version.py`) through HTTP range requests (fsspec over the zip's central directory), so
auditing the 10 GB CUDA environment downloads a few megabytes.

    python docker/lock_audit.py docker/requirements.lock [--python 3.13]
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import fsspec
import httpx
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

INDEX = "https://pypi.org/simple"
PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)(?P<rest>(?:.*\n)*?)(?=^\S|\Z)", re.M
)
GLIBC_MINOR = 41
"""The CUDA base's glibc is 2.41 (Debian 13): pip there takes manylinux wheels up to 2_41."""
ACCEPTED_SHARED = {
    "b12x/__init__.py": (
        "b12x",
        "flashinfer-python ships a b12x/__init__.py that aliases `import b12x` to FlashInfer's "
        "embedded copy; b12x's own must be the installed one (the image self-check compares it "
        "with b12x's RECORD)",
    ),
    "build_backend.py": (
        None,
        "a build script flashinfer-python and torch-c-dlpack-ext both leave at the top of "
        "site-packages; nothing imports it",
    ),
}
"""Paths two locked wheels install that the lock accepts, each with its owner (the
distribution whose file must be the installed one, checked in the image) and why."""
TORCH_CUDA = re.compile(r"^cuda\b[^=]*=\s*['\"](?P<version>[\d.]+)['\"]", re.M)


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: frozenset[str]


def pins(lock_text: str) -> list[Pin]:
    """name==version with the sha256 hashes that follow it, as pip-compile/uv write them."""
    return [
        Pin(m["name"], m["version"], frozenset(re.findall(r"sha256:([0-9a-f]{64})", m["rest"])))
        for m in PIN.finditer(lock_text)
    ]


def target_tags(python: tuple[int, int]) -> set[Tag]:
    """Tags a CPython `python` on the base's glibc x86_64 accepts."""
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)]
    platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return {*cpython_tags(python, platforms=platforms),
            *compatible_tags(python, platforms=platforms)}  # fmt: skip


def wheel_url(session: httpx.Client, pin: Pin, tags: set[Tag]) -> str | None:
    """The locked wheel of `pin` for `tags`, or None when the lock holds no such wheel."""
    index = session.get(f"{INDEX}/{canonicalize_name(pin.name)}/", timeout=60,
                        headers={"Accept": "application/vnd.pypi.simple.v1+json"})  # fmt: skip
    index.raise_for_status()
    for file in index.json()["files"]:
        name = file["filename"]
        if not name.endswith(".whl") or file["hashes"].get("sha256") not in pin.hashes:
            continue
        if parse_wheel_filename(name)[3] & tags:
            return file["url"]
    return None


def read_members(url: str, wanted: Iterable[str]) -> dict[str, str]:
    """The text of the members whose names end with any of `wanted` (range reads only)."""
    with fsspec.open(url, "rb", block_size=1 << 16) as fh, zipfile.ZipFile(fh) as wheel:
        names = [n for n in wheel.namelist() if any(n.endswith(w) for w in wanted)]
        return {n: wheel.read(n).decode("utf-8") for n in names}


@dataclass(frozen=True)
class Audit:
    files: dict[str, list[str]]
    """distribution -> the paths its wheel's RECORD installs"""
    torch_cuda: str | None
    nvcc: str | None
    no_wheel: list[str]

    def shared_paths(self) -> dict[str, list[str]]:
        """Paths that more than one locked distribution installs."""
        owners: dict[str, list[str]] = {}
        for dist, paths in self.files.items():
            for path in paths:
                owners.setdefault(path, []).append(dist)
        return {p: d for p, d in sorted(owners.items()) if len(d) > 1}

    def findings(self) -> list[str]:
        out = [f"no wheel of the lock fits the image for {pin}" for pin in self.no_wheel]
        shared = self.shared_paths()
        by_pair: dict[tuple[str, ...], list[str]] = {}
        for path, dists in shared.items():
            if path in ACCEPTED_SHARED:
                continue
            by_pair.setdefault(tuple(dists), []).append(path)
        for dists, paths in by_pair.items():
            out.append(f"{' and '.join(dists)} both install {len(paths)} path(s), e.g. "
                       f"{', '.join(paths[:3])}")  # fmt: skip
        if self.nvcc and self.torch_cuda and _minor(self.nvcc) != _minor(self.torch_cuda):
            out.append(f"nvidia-cuda-nvcc {self.nvcc} is CUDA {_minor(self.nvcc)}, torch was built "
                       f"for CUDA {self.torch_cuda}")  # fmt: skip
        return out


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def audit(lock_text: str, python: tuple[int, int]) -> Audit:
    tags = target_tags(python)
    locked = pins(lock_text)
    session = httpx.Client(follow_redirects=True)

    def one(pin: Pin) -> tuple[Pin, str | None, dict[str, str]]:
        url = wheel_url(session, pin, tags)
        if url is None:
            return pin, None, {}
        wanted = [".dist-info/RECORD"] + (["torch/version.py"] if pin.name == "torch" else [])
        return pin, url, read_members(url, wanted)

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, locked))
    files, no_wheel, torch_cuda = {}, [], None
    for pin, url, members in results:
        if url is None:
            no_wheel.append(f"{pin.name}=={pin.version}")
            continue
        for name, text in members.items():
            if name.endswith("RECORD"):
                rows = csv.reader(io.StringIO(text))
                files[pin.name] = [r[0] for r in rows if r and ".dist-info/" not in r[0]]
            elif (m := TORCH_CUDA.search(text)) is not None:
                torch_cuda = m["version"]
    nvcc = next((p.version for p in locked if p.name == "nvidia-cuda-nvcc"), None)
    return Audit(files, torch_cuda, nvcc, no_wheel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lock", type=argparse.FileType("r"))
    parser.add_argument("--python", default="3.13", help="target CPython X.Y (default 3.13)")
    args = parser.parse_args(argv)
    major, minor = (int(n) for n in args.python.split("."))
    result = audit(args.lock.read(), (major, minor))
    missing = f"; no wheel for {', '.join(result.no_wheel)}" if result.no_wheel else ""
    print(f"{len(result.files)} wheels read; torch CUDA {result.torch_cuda}, nvcc {result.nvcc}"
          f"{missing}")  # fmt: skip
    for path, dists in result.shared_paths().items():
        if path in ACCEPTED_SHARED:
            print(f"accepted: {path} from {' and '.join(dists)}: {ACCEPTED_SHARED[path][1]}")
    for finding in result.findings():
        print(f"lock audit: {finding}", file=sys.stderr)
    return 1 if result.findings() else 0


if __name__ == "__main__":
    sys.exit(main())

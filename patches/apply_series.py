"""Apply the kit's vLLM patch series to a vllm package directory, or fail naming the patch.

Used by the image build (on the installed wheel) and by the tests (on a copy of the pristine
package). Standard library only, plus GNU `patch`.

    python patches/apply_series.py --vllm-root DIR          # patch DIR in place
    python patches/apply_series.py --copy-from DIR --dest D # copy DIR to D/vllm, patch the copy
    python patches/apply_series.py --vllm-root DIR --check  # verify every patch marker is present
    python patches/apply_series.py --installed [--check]    # the vllm this Python would import

Every patch is checked with `patch --dry-run --fuzz=0` before it is applied, so a changed base
stops the series at the first patch that does not apply, with the expected vLLM version.
Exit status 0 on success, 1 when a patch does not apply or a marker is missing, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SERIES_DIR = Path(__file__).resolve().parent / "vllm"
EXPECTED_VERSION = "0.34.0"


@dataclass(frozen=True)
class Patch:
    path: Path
    subject: str
    markers: tuple[tuple[str, str], ...]  # (file relative to the package, symbol)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


class SeriesError(Exception):
    """A patch that does not apply, or a marker that is missing."""


def read_series(series_dir: Path = SERIES_DIR) -> list[Patch]:
    names = [
        line.strip()
        for line in (series_dir / "series").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    patches = []
    for name in names:
        path = series_dir / name
        header = path.read_text(encoding="utf-8").split("\n--- ", 1)[0]
        subject = re.search(r"^Subject: (.+)$", header, re.MULTILINE)
        markers = tuple(
            (m.group(1), m.group(2))
            for m in re.finditer(r"^Marker: (\S+) (\S+)$", header, re.MULTILINE)
        )
        if subject is None or not markers:
            raise SeriesError(f"{name}: header needs a Subject: line and at least one Marker:")
        patches.append(Patch(path, subject.group(1), markers))
    return patches


def installed_version(root: Path) -> str:
    text = (
        (root / "_version.py").read_text(encoding="utf-8")
        if (root / "_version.py").is_file()
        else ""
    )
    match = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
    return match.group(1) if match else "unknown"


def _patch(root: Path, patch: Patch, *, dry_run: bool) -> subprocess.CompletedProcess[str]:
    argv = [
        "patch",
        "--batch",
        "--forward",
        "--fuzz=0",
        "-p1",
        "-d",
        str(root),
        "-i",
        str(patch.path),
    ]
    if dry_run:
        argv.insert(1, "--dry-run")
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def markers_present(root: Path, patch: Patch) -> list[str]:
    """Markers of `patch` that are missing under `root`."""
    missing = []
    for rel, symbol in patch.markers:
        path = root / rel
        if not path.is_file() or symbol not in path.read_text(encoding="utf-8"):
            missing.append(f"{rel}: {symbol}")
    return missing


def apply_series(root: Path, patches: list[Patch]) -> None:
    version = installed_version(root)
    for patch in patches:
        check = _patch(root, patch, dry_run=True)
        if check.returncode != 0:
            raise SeriesError(
                f"{patch.path.name} does not apply to the vLLM at {root} (found vllm {version}; "
                f"the series is written against vllm=={EXPECTED_VERSION}):\n"
                f"{check.stdout}{check.stderr}"
            )
        done = _patch(root, patch, dry_run=False)
        if done.returncode != 0:
            raise SeriesError(
                f"{patch.path.name} failed while applying:\n{done.stdout}{done.stderr}"
            )
        missing = markers_present(root, patch)
        if missing:
            raise SeriesError(f"{patch.path.name} applied but markers are missing: {missing}")
        print(f"applied {patch.path.name}: {patch.subject}")


def check_series(root: Path, patches: list[Patch]) -> None:
    for patch in patches:
        missing = markers_present(root, patch)
        if missing:
            raise SeriesError(f"{patch.path.name} is not applied at {root}: missing {missing}")
        print(f"present {patch.path.name} (sha256 {patch.sha256})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-root", type=Path, help="vllm package directory to patch or check")
    parser.add_argument("--copy-from", type=Path, help="pristine vllm package directory to copy")
    parser.add_argument("--dest", type=Path, help="with --copy-from: directory to hold the copy")
    parser.add_argument(
        "--installed",
        action="store_true",
        help="use the vllm package this Python would import (found, not imported)",
    )
    parser.add_argument("--check", action="store_true", help="only verify the markers")
    args = parser.parse_args(argv)
    if args.installed:
        if args.vllm_root or args.copy_from:
            print("error: --installed replaces --vllm-root and --copy-from", file=sys.stderr)
            return 2
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            print("error: no vllm package is installed for this Python", file=sys.stderr)
            return 2
        args.vllm_root = Path(next(iter(spec.submodule_search_locations)))
    if bool(args.copy_from) != bool(args.dest) or bool(args.copy_from) == bool(args.vllm_root):
        print("error: give --vllm-root DIR, or --copy-from DIR with --dest DIR", file=sys.stderr)
        return 2
    try:
        patches = read_series()
        if args.copy_from:
            if not (args.copy_from / "__init__.py").is_file():
                print(f"error: --copy-from {args.copy_from} is not a vllm package", file=sys.stderr)
                return 2
            root = args.dest / "vllm"
            if root.exists():
                shutil.rmtree(root)
            shutil.copytree(
                args.copy_from, root, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            root = args.vllm_root
            if not (root / "__init__.py").is_file():
                print(f"error: --vllm-root {root} is not a vllm package", file=sys.stderr)
                return 2
        if args.check:
            check_series(root, patches)
        else:
            apply_series(root, patches)
    except SeriesError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

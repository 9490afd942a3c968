"""The image's source lock: every input that decides what the image contains, and its SHA-256.

Computed from the kit's files (the same relative layout in a checkout and under /opt/kit), so
`make build` can pass the hash as an OCI label and the build can write the same lock into the
image and refuse to continue if the two disagree.

    python docker/source_lock.py --engine cuda|cpu --base IMAGE@sha256:... --commit SHA
        [--write PATH] [--expect-sha256 HEX]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "patches"))
from apply_series import read_series  # noqa: E402  (patches/ is not a package)

ENGINE_LOCKS = {"cuda": "docker/requirements.lock", "cpu": "docker/requirements-cpu.lock"}
"""Each engine's hash-locked Python requirements (docker/engine/install-<engine>.sh)."""


def source_lock(root: Path, engine: str, base: str, commit: str) -> dict[str, object]:
    def digest(rel: str) -> str:
        return hashlib.sha256((root / rel).read_bytes()).hexdigest()

    series = [patch.path.name for patch in read_series(root / "patches/vllm")]
    inputs = (ENGINE_LOCKS[engine], "patches/vllm/series", f"docker/engine/install-{engine}.sh")
    return {
        "engine": engine,
        "base_image": base,
        "kit_commit": commit,
        "files": {rel: digest(rel) for rel in inputs},
        "patches": {name: digest(f"patches/vllm/{name}") for name in series},
    }


def encode(lock: dict[str, object]) -> bytes:
    return (json.dumps(lock, sort_keys=True, indent=2) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=sorted(ENGINE_LOCKS), default="cuda")
    parser.add_argument("--base", required=True,
                        help="base image digest reference, or this engine's image ID (make demo)")
    parser.add_argument("--commit", required=True, help="kit commit the image is built from")
    parser.add_argument("--write", type=Path, help="write the lock to this path")
    parser.add_argument("--expect-sha256", help="fail unless the lock hashes to this")
    args = parser.parse_args(argv)
    data = encode(source_lock(ROOT, args.engine, args.base, args.commit))
    sha = hashlib.sha256(data).hexdigest()
    if args.expect_sha256 and args.expect_sha256 != sha:
        print(
            f"error: source lock hashes to {sha}, the build was told {args.expect_sha256}",
            file=sys.stderr,
        )
        return 1
    if args.write:
        args.write.write_bytes(data)
    print(sha)
    return 0


if __name__ == "__main__":
    sys.exit(main())

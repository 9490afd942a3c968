"""`make build`: build and tag the kit's image from pinned inputs only.

Refuses without a base image digest in compose/images.lock. Passes the base digest, the kit
commit and the source-lock SHA-256 (docker/source_lock.py) as build arguments; the build writes
the same lock to /opt/kit/source.lock and fails if it hashes differently.

    python docker/build.py [--tag NAME:TAG] [--dry-run]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "docker")]

from source_lock import encode, source_lock  # noqa: E402

from launch.errors import USAGE_EXIT, ProfileError  # noqa: E402
from launch.image_lock import resolve_image  # noqa: E402


def kit_commit() -> str:
    result = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=False)  # fmt: skip
    if result.returncode != 0:
        raise ProfileError("git", str(ROOT), "is not a git checkout", "build from a clone")
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True,
                           text=True, check=True).stdout.strip()  # fmt: skip
    if dirty:
        raise ProfileError(
            "git status",
            "modified files",
            "the image must come from a commit",
            "commit or stash the changes, then build",
        )
    return result.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tag", help="image name:tag (default glm53-kit:<commit>)")
    parser.add_argument("--dry-run", action="store_true", help="print the build command only")
    args = parser.parse_args(argv)
    try:
        base = resolve_image("base", os.environ)
        commit = kit_commit()
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    lock_sha = hashlib.sha256(encode(source_lock(ROOT, base, commit))).hexdigest()
    tag = args.tag or f"glm53-kit:{commit[:12]}"
    argv_build = [
        "docker", "build", "--tag", tag,
        "--build-arg", f"BASE_IMAGE={base}",
        "--build-arg", f"KIT_COMMIT={commit}",
        "--build-arg", f"SOURCE_LOCK_SHA256={lock_sha}",
        str(ROOT),
    ]  # fmt: skip
    print(shlex.join(argv_build), flush=True)
    if args.dry_run:
        return 0
    docker = shutil.which("docker")
    if docker is None:
        print("error: docker is not on PATH", file=sys.stderr)
        return USAGE_EXIT
    os.execv(docker, argv_build)
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())

"""A Debian 12 base image made from Debian's packages, for the CPU image where no registry with
base images is reachable: `mmdebstrap --variant=minbase` writes a root filesystem, `docker import`
turns it into an image, and the tag is pushed so it can be pinned by digest like every image.

    python docker/debian_base.py --tag 127.0.0.1:5000/glm53/debian:bookworm [--push]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)


def make_base(tag: str, push: bool) -> str:
    """Build, import and (optionally) push the base; return the imported image id."""
    with tempfile.TemporaryDirectory(prefix="kit-debian-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                "--include=ca-certificates",
                "bookworm",
                str(rootfs),
                *MIRRORS,
            ],
            check=True,
        )
        image_id = subprocess.run(
            ["docker", "import", str(rootfs), tag], check=True, capture_output=True, text=True
        ).stdout.strip()
    if push:
        subprocess.run(["docker", "push", "--quiet", tag], check=True)
    return image_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tag", required=True, help="registry/repo:tag to import as")
    parser.add_argument("--push", action="store_true", help="push the tag to its registry")
    args = parser.parse_args(argv)
    print(make_base(args.tag, args.push))
    return 0


if __name__ == "__main__":
    sys.exit(main())

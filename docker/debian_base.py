"""The kit's base images, made from Debian's packages where no registry with base images is
reachable: `mmdebstrap --variant=minbase` writes a root filesystem, `docker import` turns it into
an image, and the tag is pushed so it can be pinned by digest like every image.

    cpu   Debian 12 (bookworm): the CPU image installs its own packages on top.
    cuda  Debian 13 (trixie) with what the CUDA image's runtime compiles with: g++ 14.2 (inside
          nvcc 13.0's host-compiler range), CPython 3.13 with its headers and venv, GNU patch
          (the patch series) and ca-certificates. The CUDA toolkit itself comes from PyPI's
          wheels in docker/requirements.lock, hash-locked like every other package. Like an
          nvidia/cuda base, its config carries what the NVIDIA container toolkit reads
          (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, and NVIDIA_REQUIRE_CUDA, so a driver
          too old for CUDA 13.0 is refused at container start with the toolkit's own message) and
          where the toolkit will be (CUDA_HOME, its bin on PATH, LIBRARY_PATH at the link-time
          libcuda stub). The CPU base carries none of it.
    prometheus  Debian 13's Prometheus for the monitoring compose profile (`make up
          MONITORING=1`) where prom/prometheus cannot be pulled, laid out like it: the
          package's user prometheus owns the data directory /prometheus (the publisher
          image's), so one compose service runs either.

    python docker/debian_base.py --engine cuda --tag 127.0.0.1:5000/glm53/debian:trixie [--push]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CUDA_VERSION = "13.0"
"""The CUDA version of the toolkit wheels in docker/requirements.lock (torch 2.14.0's); the
self-check compares it with torch.version.cuda and nvcc."""
CUDA_HOME = "/usr/local/cuda"
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Base:
    suite: str
    packages: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    """ENV lines written into the image config at import."""
    config: tuple[str, ...] = ()
    """Further image config at import (`docker import --change`: USER, ENTRYPOINT, ...)."""
    customize: tuple[str, ...] = ()
    """mmdebstrap --customize-hook commands, run on the finished tree ("$1" is its root)."""

    def mirrors(self) -> tuple[str, ...]:
        return (
            f"deb http://deb.debian.org/debian {self.suite} main",
            f"deb http://deb.debian.org/debian {self.suite}-updates main",
            f"deb http://deb.debian.org/debian-security {self.suite}-security main",
        )


BASES = {
    "cpu": Base("bookworm", ("ca-certificates",)),
    "cuda": Base(
        "trixie",
        ("ca-certificates", "g++", "patch", "python3.13", "python3.13-dev", "python3.13-venv"),
        (
            ("NVIDIA_VISIBLE_DEVICES", "all"),
            ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
            ("NVIDIA_REQUIRE_CUDA", f"cuda>={CUDA_VERSION}"),
            ("CUDA_HOME", CUDA_HOME),
            ("PATH", f"{CUDA_HOME}/bin:{DEBIAN_PATH}"),
            ("LIBRARY_PATH", f"{CUDA_HOME}/lib64/stubs"),
        ),
    ),
    # Not a base: the monitoring profile's Prometheus, Debian 13's own package (2.53), run as the
    # package's unprivileged user with its data in /prometheus (a volume), as prom/prometheus.
    "prometheus": Base(
        "trixie",
        ("prometheus",),
        config=("USER prometheus", "WORKDIR /prometheus",
                'ENTRYPOINT ["/usr/bin/prometheus"]', "EXPOSE 9090"),
        customize=('chroot "$1" install -d -o prometheus -g prometheus /prometheus',),
    ),
}


def make_base(base: Base, tag: str, push: bool) -> str:
    """Build, import and (optionally) push the base; return the imported image id."""
    with tempfile.TemporaryDirectory(prefix="kit-debian-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                "--quiet",
                "--variant=minbase",
                f"--include={','.join(base.packages)}",
                *(f"--customize-hook={hook}" for hook in base.customize),
                base.suite,
                str(rootfs),
                *base.mirrors(),
            ],
            check=True,
        )
        lines = [f"ENV {key}={value}" for key, value in base.env] + list(base.config)
        changes = [arg for line in lines for arg in ("--change", line)]
        image_id = subprocess.run(
            ["docker", "import", *changes, str(rootfs), tag],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    if push:
        subprocess.run(["docker", "push", "--quiet", tag], check=True)
    return image_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=sorted(BASES), default="cpu")
    parser.add_argument("--tag", required=True, help="registry/repo:tag to import as")
    parser.add_argument("--push", action="store_true", help="push the tag to its registry")
    args = parser.parse_args(argv)
    print(make_base(BASES[args.engine], args.tag, args.push))
    return 0


if __name__ == "__main__":
    sys.exit(main())

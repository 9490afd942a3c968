"""`make build` / `make build-cpu`: build and tag the kit's image from pinned inputs only.

Refuses without the engine's base image digest in compose/images.lock (BASE_IMAGE for cuda,
CPU_BASE_IMAGE for cpu). Passes the base digest, the kit commit and the source-lock SHA-256
(docker/source_lock.py) as build arguments; the build writes the same lock to /opt/kit/source.lock
and fails if it hashes differently. Uses the classic builder (DOCKER_BUILDKIT=0), which every
Docker engine has.

Per-build inputs are staged in a temporary directory and served over HTTP on the Docker bridge
address for the build only (`BUILD_INPUTS`), never copied into the context: for cpu, the torch
2.13.0+cpu wheel (from `--torch-wheel`, or fetched by this Python's pip; the lock's hash decides
whether the image accepts it), which pip reads through `--find-links`; with `--trust-host-ca`
(test builds only), the host's extra CA certificates, which the install step trusts and removes
again within its one RUN. So no input is in any layer of the image.

    python docker/build.py [--engine cuda|cpu] [--tag NAME:TAG] [--trust-host-ca]
        [--torch-wheel FILE] [--allow-dirty] [--base-id ID] [--dry-run]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "docker")]

from source_lock import ENGINE_LOCKS, encode, source_lock  # noqa: E402

from launch.docker_api import bridge_address, connect, local_image_id  # noqa: E402
from launch.errors import USAGE_EXIT, UsageError  # noqa: E402
from launch.image_lock import BASES, is_local_id, resolve_image  # noqa: E402

HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
TORCH_CPU = re.compile(
    r"^torch==(?P<version>\S+\+cpu) \\\n(?P<hashes>(?:\s+--hash=sha256:\w+.*\n)+)", re.M
)


def kit_commit(allow_dirty: bool) -> str:
    result = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise UsageError("git", str(ROOT), "is not a git checkout", "build from a clone")
    # compose/images.lock is not an input of the image (the base digest is passed and recorded in
    # the source lock), so `make pin SOURCE=base` before `make build` does not make it dirty
    dirty = subprocess.run(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--", ".",
         ":!compose/images.lock"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if dirty and not allow_dirty:
        raise UsageError(
            "git status",
            dirty.splitlines()[0].strip(),
            "tracked files are modified; the image must come from a commit",
            "commit or stash the changes, or pass --allow-dirty (the commit is then labelled "
            "<sha>-dirty)",
        )
    return result.stdout.strip() + ("-dirty" if dirty else "")


def locked_torch(lock: Path) -> tuple[str, set[str]]:
    """The +cpu torch version and its allowed SHA-256 hashes from the CPU lock."""
    match = TORCH_CPU.search(lock.read_text(encoding="utf-8"))
    if match is None:
        raise UsageError(str(lock), "torch", "has no torch==<version>+cpu entry", "run make lock")
    return match.group("version"), set(re.findall(r"sha256:(\w+)", match.group("hashes")))


def stage_torch_wheel(wheel: Path | None, inputs: Path) -> Path:
    """Put the locked torch wheel into inputs/wheels; refuse one whose hash is not locked."""
    version, hashes = locked_torch(ROOT / ENGINE_LOCKS["cpu"])
    dest = inputs / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    if wheel is None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux_2_28_x86_64",
                "--dest",
                str(dest),
                f"torch=={version}",
            ],
            check=True,
        )
        found = sorted(dest.glob("torch-*.whl"))
    else:
        found = [wheel]
    for path in found:
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        if sha not in hashes:
            raise UsageError(
                "--torch-wheel",
                str(path),
                f"sha256 {sha} is not in the CPU lock for torch=={version}",
                "give the wheel the lock names",
            )
        if path.parent != dest:
            shutil.copy2(path, dest / path.name)
    return dest


def stage_host_ca(inputs: Path) -> int:
    """The host's extra CA certificates into inputs/ca, listed in ca/index.txt."""
    dest = inputs / "ca"
    dest.mkdir(parents=True, exist_ok=True)
    certs = sorted(HOST_CA_DIR.glob("*.crt"))
    for crt in certs:
        shutil.copy2(crt, dest / crt.name)
    (dest / "index.txt").write_text("".join(f"{c.name}\n" for c in certs), encoding="utf-8")
    return len(certs)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def served(directory: Path) -> Iterator[str]:
    """`directory` over HTTP on the Docker bridge address while the build runs; its URL."""
    host = bridge_address(connect("build without per-build inputs"))
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def local_base(image_id: str) -> str:
    """A base that exists only on this engine, by its ID (the content digest of its config, so
    the source lock still names exactly what the image was built from)."""
    if not is_local_id(image_id):
        raise UsageError("--base-id", image_id, "is not an image ID (sha256:<64 hex>)",
                         "give the ID `docker image inspect --format {{.Id}} TAG` prints")
    if local_image_id(connect("build from a pinned base instead"), image_id) is None:
        raise UsageError("--base-id", image_id, "is not an image on this Docker engine",
                         "make the base first (`python docker/debian_base.py --engine cpu --tag "
                         "TAG` prints its ID)")  # fmt: skip
    return image_id


def build_argv(engine: str, tag: str, base: str, commit: str, lock_sha: str,
               inputs_url: str = "") -> list[str]:  # fmt: skip
    return [
        "docker",
        "build",
        "--tag",
        tag,
        "--build-arg",
        f"BUILD_INPUTS={inputs_url}",
        "--build-arg",
        f"ENGINE={engine}",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        f"KIT_COMMIT={commit}",
        "--build-arg",
        f"SOURCE_LOCK_SHA256={lock_sha}",
        str(ROOT),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=sorted(ENGINE_LOCKS), default="cuda")
    parser.add_argument("--tag", help="image name:tag (default glm53-kit[-cpu]:<commit>)")
    parser.add_argument(
        "--trust-host-ca",
        action="store_true",
        help="test builds only: trust the host's extra CA certificates",
    )
    parser.add_argument("--torch-wheel", type=Path, help="cpu: the locked torch +cpu wheel")
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="build from modified tracked files (labelled <sha>-dirty)",
    )
    parser.add_argument("--base-id", help="build from this engine's image ID instead of the "
                        "lock's base (`make demo`'s Debian base, made here and never pushed)")
    parser.add_argument("--dry-run", action="store_true", help="print the build command only")
    args = parser.parse_args(argv)
    try:
        base = local_base(args.base_id) if args.base_id else resolve_image(BASES[args.engine],
                                                                           os.environ)
        commit = kit_commit(args.allow_dirty)
        if args.torch_wheel is not None and not args.torch_wheel.is_file():
            raise UsageError(
                "--torch-wheel",
                str(args.torch_wheel),
                "is not a file",
                "give the path of the locked torch wheel",
            )
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    lock_sha = hashlib.sha256(encode(source_lock(ROOT, args.engine, base, commit))).hexdigest()
    suffix = "" if args.engine == "cuda" else f"-{args.engine}"
    tag = args.tag or f"glm53-kit{suffix}:{commit[:12]}"
    argv_build = build_argv(args.engine, tag, base, commit, lock_sha)
    print(shlex.join(argv_build), flush=True)
    if args.dry_run:
        return 0
    if shutil.which("docker") is None:
        print("error: docker is not on PATH", file=sys.stderr)
        return USAGE_EXIT
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    try:
        with tempfile.TemporaryDirectory(prefix="kit-build-inputs-") as tmp:
            inputs = Path(tmp)
            if args.engine == "cpu":
                stage_torch_wheel(args.torch_wheel, inputs)
            if args.trust_host_ca:
                print(f"test build: trusting {stage_host_ca(inputs)} host CA certificate(s)",
                      flush=True)  # fmt: skip
            if not any(inputs.iterdir()):
                return subprocess.run(argv_build, env=env, check=False).returncode
            with served(inputs) as url:
                argv_served = build_argv(args.engine, tag, base, commit, lock_sha, url)
                print(f"build inputs served at {url} for this build only:\n"
                      f"{shlex.join(argv_served)}", flush=True)  # fmt: skip
                return subprocess.run(argv_served, env=env, check=False).returncode
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT


if __name__ == "__main__":
    sys.exit(main())

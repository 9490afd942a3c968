"""`python -m launch pin REPO:TAG --source kit|qualified|base`: write the tag's digest to the lock.

`--check` resolves and compares without writing: exit 1 when the tag now points elsewhere
(a re-pushed tag), so a deployment notices before it pulls something it did not qualify.
`--local` pins an image that was built here and never pushed: the Docker engine's image ID, which
compose on this engine runs exactly as it runs a digest.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.docker_api import connect, local_image_id
from launch.errors import UsageError
from launch.image_lock import (
    DIGEST_REF,
    LOCK_VAR,
    PIN_KEYS,
    SOURCES,
    lock_path,
    read_lock,
    write_lock,
)
from launch.registry import parse_ref, resolve_digest

NAME = "pin"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="resolve an image tag to its digest and lock it")
    parser.add_argument("image", help="repo:tag, e.g. registry.example/kit/glm53:2026-11-29")
    parser.add_argument(
        "--source",
        choices=sorted(PIN_KEYS),
        default="kit",
        help="which lock entry to write: a profile image or the build's base",
    )
    parser.add_argument("--lock", type=Path, default=None,
                        help=f"lock file (env format; default ${LOCK_VAR}, else "
                        "compose/images.lock)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the lock without writing; exit 1 if it moved",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    parser.add_argument(
        "--local",
        action="store_true",
        help="pin the local engine's image ID of an image built here (not pushed anywhere)",
    )
    return parser


def local_pin(image: str, source: str) -> str:
    """The local engine's ID of `image` (a kit or CPU image built here)."""
    if source not in SOURCES:
        raise UsageError(
            "--source", source, "cannot be pinned locally: a build's base must be pullable",
            f"pin it from its registry, or use one of {', '.join(SOURCES)} with --local",
        )  # fmt: skip
    client = connect(f"pin from a registry without --local (`make pin IMAGE={image}`)")
    image_id = local_image_id(client, image)
    if image_id is None:
        raise UsageError(
            "IMAGE", image, "is not an image on this Docker engine",
            "build it first (`make build` / `make build-cpu`), or check `docker images`",
        )  # fmt: skip
    return image_id


def run(args: argparse.Namespace) -> int:
    args.lock = args.lock or lock_path()
    if not args.lock.is_file():
        raise UsageError("--lock", str(args.lock), "does not exist", "use compose/images.lock")
    key = PIN_KEYS[args.source]
    if args.local:
        return write_or_check(args, key, local_pin(args.image, args.source), args.image)
    ref = parse_ref(args.image)
    digest = resolve_digest(ref, timeout=args.timeout)
    pinned = ref.pinned(digest)
    old = read_lock(args.lock).get(key, "")
    old_match = DIGEST_REF.match(old)
    moved = old_match is not None and old_match.group("name") == ref.name and old != pinned
    if moved:
        print(
            f"{ref.name}:{ref.tag} moved: {old_match.group('digest')} -> {digest} "
            "(the tag was re-pushed)"
        )
    return write_or_check(args, key, pinned, f"{ref.name}:{ref.tag}")


def write_or_check(args: argparse.Namespace, key: str, pinned: str, shown: str) -> int:
    old = read_lock(args.lock).get(key, "")
    if args.check:
        if old == pinned:
            print(f"{key}={pinned} (unchanged)")
            return 0
        print(f"{key} in {args.lock.name} is {old or 'empty'}; {shown} is {pinned}")
        return 1
    write_lock({key: pinned}, args.lock)
    where = " (a local image ID: compose on this engine runs it)" if args.local else ""
    print(f"{key}={pinned} written to {args.lock}{where}")
    return 0

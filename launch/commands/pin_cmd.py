"""`python -m launch pin REPO:TAG --source kit|qualified|base`: write the tag's digest to the lock.

`--check` resolves and compares without writing: exit 1 when the tag now points elsewhere
(a re-pushed tag), so a deployment notices before it pulls something it did not qualify.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.errors import ProfileError
from launch.image_lock import DIGEST_REF, LOCK_PATH, PIN_KEYS, read_lock, write_lock
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
    parser.add_argument("--lock", type=Path, default=LOCK_PATH, help="lock file (env format)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the lock without writing; exit 1 if it moved",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    return parser


def run(args: argparse.Namespace) -> int:
    if not args.lock.is_file():
        raise ProfileError("--lock", str(args.lock), "does not exist", "use compose/images.lock")
    ref = parse_ref(args.image)
    digest = resolve_digest(ref, timeout=args.timeout)
    pinned = ref.pinned(digest)
    key = PIN_KEYS[args.source]
    old = read_lock(args.lock).get(key, "")
    old_match = DIGEST_REF.match(old)
    moved = old_match is not None and old_match.group("name") == ref.name and old != pinned
    if moved:
        print(
            f"{ref.name}:{ref.tag} moved: {old_match.group('digest')} -> {digest} "
            "(the tag was re-pushed)"
        )
    if args.check:
        if old == pinned:
            print(f"{key}={pinned} (unchanged)")
            return 0
        print(f"{key} in {args.lock.name} is {old or 'empty'}; {ref.name}:{ref.tag} is {pinned}")
        return 1
    write_lock({key: pinned}, args.lock)
    print(f"{key}={pinned} written to {args.lock}")
    return 0

"""The image lock compose reads: which image each profile runs, always by digest.

`compose/images.lock` is an env file holding one digest reference per image source: `KIT_IMAGE`
(this kit's CUDA image, empty until `make pin`), `QUALIFIED_IMAGE` (seed 000's qualified runtime),
`QUALIFIED_SPLIT_IMAGE` (the published runtime qualified with seed 004's split pages) and
`CPU_IMAGE` (the kit's CPU image), plus the bases the builds start from. A profile names its
source in `deployment.image`. A tag is never accepted where a digest is required: tags move.
A profile image may also be pinned by its local image ID (`sha256:<64 hex>`, `make pin LOCAL=1`):
content-addressed like a digest, but it exists only on the engine that built it, so compose can
run it there and nothing else can pull it (the Kubernetes renderer refuses it).
`KIT_IMAGES_LOCK` points every command at another lock file (the e2e run pins into a copy, so a
checkout's tracked lock is never rewritten by a test).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from pathlib import Path

from launch.errors import UsageError

KIT_ROOT = Path(__file__).resolve().parent.parent
"""The kit's checkout (or /opt/kit in an image): launch/, kvgeometry/, compose/ ... below it."""
COMPOSE_DIR = KIT_ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
LOCK_VAR = "KIT_IMAGES_LOCK"
"""Names another lock file for every command (the e2e run and the tests pin into copies)."""
SOURCES = {
    "kit": "KIT_IMAGE",
    "qualified": "QUALIFIED_IMAGE",
    "qualified-split": "QUALIFIED_SPLIT_IMAGE",
    "cpu": "CPU_IMAGE",
}
"""Image sources a profile can run (`deployment.image`) -> lock key."""
BASES = {"cuda": "base", "cpu": "cpu-base"}
"""Image engine (docker/build.py --engine) -> the pin source of the base it is built from."""
MONITORING_SOURCES = {"prometheus": "PROMETHEUS_IMAGE", "grafana": "GRAFANA_IMAGE",
                      "dcgm-exporter": "DCGM_EXPORTER_IMAGE"}  # fmt: skip
"""The monitoring compose profiles' images -> lock key (compose/compose.yaml reads the keys)."""
PIN_KEYS = {**SOURCES, "base": "BASE_IMAGE", "cpu-base": "CPU_BASE_IMAGE", **MONITORING_SOURCES}
MAKE_FIRST = {
    "kit": "build the CUDA image first (`make build TAG=glm53-kit:local`, docs/images.md: its "
           "Debian 13 base, then the build), or run the profile on its qualified runtime with "
           "IMAGE_SOURCE=qualified",
    "cpu": "run `make demo` (it builds the CPU image and its Debian 12 base, pins the image "
           "and starts cpu-tiny), or build it yourself first (`make build-cpu "
           "TAG=glm53-kit-cpu:local`, docs/images.md: its Debian 12 base, then the build)",
    "base": "make the Debian 13 base first (`python docker/debian_base.py --engine cuda --tag "
            "REPO:TAG --push`)",
    "cpu-base": "make the Debian 12 base first (`python docker/debian_base.py --engine cpu --tag "
                "REPO:TAG --push`)",
}
"""For a source whose image the kit makes: what makes it, said before the pin that follows."""
"""Everything `make pin` can write: the profile images, the builds' base images and the
monitoring profiles' images."""
DIGEST_REF = re.compile(
    r"^(?P<name>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r"@(?P<digest>sha256:[0-9a-f]{64})$"
)
LOCAL_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
"""An image ID of the local engine (the image config's digest)."""
_LINE = re.compile(r"^(?P<key>[A-Z_][A-Z0-9_]*)=(?P<value>.*)$")


def is_digest_ref(ref: str) -> bool:
    return DIGEST_REF.match(ref) is not None


def is_local_id(ref: str) -> bool:
    return LOCAL_ID.match(ref) is not None


def parse_env(lines: list[str]) -> dict[str, str]:
    """KEY=VALUE settings of an env file, read the way Compose reads compose/.env (python-dotenv:
    quotes stripped, an inline ` # comment` dropped, `export KEY=` accepted, `${VAR}` expanded);
    comments and blank lines ignored, a key without a value left out."""
    from dotenv import dotenv_values  # in every vLLM image too (fastapi[standard] brings it)

    values = dotenv_values(stream=io.StringIO("\n".join(lines)))
    return {key: value for key, value in values.items() if value is not None}


def lock_path() -> Path:
    """The lock every command reads: $KIT_IMAGES_LOCK, else compose/images.lock (read per call,
    so a test or the e2e run can point at a copy)."""
    return Path(os.environ.get(LOCK_VAR) or COMPOSE_DIR / "images.lock")


def read_text(path: Path, field: str, fix: str) -> str:
    """A settings file's text; a missing or non-UTF-8 file is the kit's usage error naming
    `field` (the variable or file that points at it), never a traceback. `fix` is for a file
    that cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UsageError(field, str(path), f"cannot be read ({err.strerror or err})", fix) from err
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            field, str(path),
            f"is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})",
            f"save it as UTF-8, e.g. `iconv -f LATIN1 -t UTF-8 {path} > {path.name}.utf8`, "
            "then move that into place",
        ) from err  # fmt: skip


def read_lock(path: Path | None = None) -> dict[str, str]:
    """KEY=VALUE lines of the image lock."""
    path = path or lock_path()
    fix = f"point {LOCK_VAR} at an existing lock, or unset it to use compose/images.lock"
    return parse_env(read_text(path, LOCK_VAR, fix).splitlines())


def write_lock(updates: Mapping[str, str], path: Path | None = None) -> None:
    """Set keys in the lock, keeping its comments and order."""
    path = path or lock_path()
    fix = f"point {LOCK_VAR} at an existing lock, or unset it to use compose/images.lock"
    lines = read_text(path, LOCK_VAR, fix).splitlines()
    pending = dict(updates)
    for i, line in enumerate(lines):
        match = _LINE.match(line.strip())
        if match and match.group("key") in pending:
            key = match.group("key")
            lines[i] = f"{key}={pending.pop(key)}"
    lines += [f"{key}={value}" for key, value in pending.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def resolve_image(
    source: str,
    environ: Mapping[str, str],
    path: Path | None = None,
    *,
    override_var: str = "IMAGE",
    local_ok: bool = True,
) -> str:
    """The digest reference for `source`: `override_var` from the environment (profile images
    only), else the lock's entry. A local image ID counts for profile images where the image runs
    on this engine (`local_ok`), never for the builds' bases."""
    path = path or lock_path()
    key = PIN_KEYS[source]
    override = environ.get(override_var) if source in SOURCES else None
    ref = override if override else read_lock(path).get(key, "")
    field, fix = (
        (override_var, f"set {override_var}=repo@sha256:<digest>, or unset it to use the lock")
        if override
        else (key, (f"{MAKE_FIRST[source]}; then " if source in MAKE_FIRST else "")
              + f"run `make pin IMAGE=repo:tag SOURCE={source}` to write the digest into "
              f"{path.name}" + (" (LOCAL=1 for an image only on this engine)"
                                if source in SOURCES else ""))
    )  # fmt: skip
    if not ref:
        raise UsageError(field, ref, "has no image digest", fix)
    if is_local_id(ref):
        if local_ok and source in SOURCES:
            return ref
        raise UsageError(
            field, ref,
            "is a local image ID: it exists only on the engine that built it, and nothing can "
            "pull it from there",
            f"push the image and pin it by digest: `make pin IMAGE=repo:tag SOURCE={source}`",
        )  # fmt: skip
    if not is_digest_ref(ref):
        raise UsageError(field, ref, "is not a digest reference (tags move)", fix)
    return ref


def describe_image(source: str, environ: Mapping[str, str],
                   path: Path | None = None) -> str | None:  # fmt: skip
    """Which image a profile runs, for the plan: source, lock key and digest reference, or why
    there is none yet. None where no lock is at hand (inside an image, where the kit's own
    compose/images.lock is not mounted)."""
    path = path or lock_path()
    if not path.is_file() and path == COMPOSE_DIR / "images.lock":
        return None
    read_lock(path)  # a lock that $KIT_IMAGES_LOCK names and that cannot be read is an error
    key = SOURCES[source]
    try:
        ref = resolve_image(source, environ, path)
    except UsageError as err:
        return f"{source} ({key}): none usable - {err.rule}; {err.fix}"
    origin = "IMAGE from the environment or compose/.env" if environ.get("IMAGE") else key
    where = " (a local image ID: runs on this engine only)" if is_local_id(ref) else ""
    return f"{source} ({origin}): {ref}{where}"

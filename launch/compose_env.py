"""compose/.env: the user's settings above a marker, what `launch configure` derives below it.

Plain `docker compose up` in compose/ reads this file, so everything compose interpolates
(profile, image digest, shared memory, start period, which compose files) is written here, not
left for the user to guess. The user's lines (GPU_DEVICES, HOST_PORT, HF_TOKEN, overrides) are
kept as written; only the block after the marker is rewritten, and it is never read back as a
user setting, so a re-pinned image or another profile replaces it cleanly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from launch.image_lock import COMPOSE_DIR, parse_env, read_text

DEFAULT_ENV_PATH = COMPOSE_DIR / ".env"
ENV_FILE_VAR = "KIT_ENV_FILE"
"""Names another settings file for the kit's commands (the tests point it at a temporary file,
so a user's compose/.env never reaches them); compose then gets it with `--env-file`."""
MARKER = "# ---- written by `python -m launch configure`; edit the settings above this line ----"


def env_path() -> Path:
    """The settings file: $KIT_ENV_FILE, else compose/.env (read per call)."""
    return Path(os.environ.get(ENV_FILE_VAR) or DEFAULT_ENV_PATH)


def compose_env_args() -> list[str]:
    """`--env-file PATH` for a compose command the kit runs, where the settings file is not the
    compose/.env compose reads by itself."""
    path = env_path()
    return [] if path == DEFAULT_ENV_PATH else ["--env-file", str(path)]


def _split(path: Path) -> tuple[list[str], list[str]]:
    if not path.is_file():
        return [], []
    field = ENV_FILE_VAR if path != DEFAULT_ENV_PATH else "compose/.env"
    fix = "check its permissions, or remove it to start from compose/.env.example"
    lines = read_text(path, field, fix).splitlines()
    if MARKER in lines:
        cut = lines.index(MARKER)
        return lines[:cut], lines[cut + 1 :]
    return lines, []


def user_settings(path: Path | None = None) -> dict[str, str]:
    """KEY=VALUE settings the user wrote (the generated block is not a user setting)."""
    return parse_env(_split(path or env_path())[0])


def generated(path: Path | None = None) -> dict[str, str]:
    """What the last `configure` wrote."""
    return parse_env(_split(path or env_path())[1])


def write_generated(values: Mapping[str, str], header: str, path: Path | None = None) -> None:
    """Rewrite the block after the marker; create the file (from .env.example) if missing."""
    path = path or env_path()
    user, _ = _split(path)
    if not path.is_file():
        example = COMPOSE_DIR / ".env.example"
        user = example.read_text(encoding="utf-8").splitlines() if example.is_file() else []
    while user and not user[-1].strip():
        user.pop()
    block = [MARKER, f"# {header}", *(f"{k}={v}" for k, v in values.items())]
    path.write_text("\n".join([*user, "", *block]) + "\n", encoding="utf-8")

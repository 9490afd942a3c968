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

from launch.image_lock import COMPOSE_DIR, parse_env
from launch.profile import Profile

ENV_PATH = COMPOSE_DIR / ".env"
MARKER = "# ---- written by `python -m launch configure`; edit the settings above this line ----"


def _split(path: Path) -> tuple[list[str], list[str]]:
    if not path.is_file():
        return [], []
    lines = path.read_text(encoding="utf-8").splitlines()
    if MARKER in lines:
        cut = lines.index(MARKER)
        return lines[:cut], lines[cut + 1 :]
    return lines, []


def user_settings(path: Path = ENV_PATH) -> dict[str, str]:
    """KEY=VALUE settings the user wrote (the generated block is not a user setting)."""
    return parse_env(_split(path)[0])


def generated(path: Path = ENV_PATH) -> dict[str, str]:
    """What the last `configure` wrote."""
    return parse_env(_split(path)[1])


def write_generated(values: Mapping[str, str], header: str, path: Path = ENV_PATH) -> None:
    """Rewrite the block after the marker; create the file (from .env.example) if missing."""
    user, _ = _split(path)
    if not path.is_file():
        example = COMPOSE_DIR / ".env.example"
        user = example.read_text(encoding="utf-8").splitlines() if example.is_file() else []
    while user and not user[-1].strip():
        user.pop()
    block = [MARKER, f"# {header}", *(f"{k}={v}" for k, v in values.items())]
    path.write_text("\n".join([*user, "", *block]) + "\n", encoding="utf-8")


def default_url(profile: Profile) -> str:
    """Where a started profile answers on this host: compose publishes it on HOST_PORT (the
    environment, then compose/.env); without compose, the profile's own port."""
    port = os.environ.get("HOST_PORT") or user_settings().get("HOST_PORT")
    return f"http://127.0.0.1:{port or profile.deployment.port}"

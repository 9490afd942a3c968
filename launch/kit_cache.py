"""Where the kit keeps what it can ask or make again: capacity answers (`capacity.host`) and
`make demo`'s record of a passed smoke."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_VAR = "KIT_CACHE_DIR"
"""Overrides the directory (default: $XDG_CACHE_HOME/glm53-kit, else ~/.cache/glm53-kit); the
tests point it at a directory of their own."""


def kit_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get(CACHE_VAR) or Path(base) / "glm53-kit")

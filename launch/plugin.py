"""Enable the kit's vLLM plugin (kvgeometry) for the server `launch run` execs.

vLLM finds general plugins through entry points, and `importlib.metadata` finds an entry point in
any `*.dist-info` directory on sys.path. The kit is not pip-installed in its images (it is copied,
or mounted into the qualified image, at /opt/kit on PYTHONPATH), so `launch run` writes the
plugin's metadata to a directory of its own and puts that directory on PYTHONPATH; every vLLM
process (API server, engine core, workers) inherits it. An allow-list in VLLM_PLUGINS gets the
plugin's name added, so the geometry line is not silently switched off.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from kvgeometry import ENTRY_POINT

ENTRY_DIR = Path(tempfile.gettempdir()) / "glm53-kit-plugins"
DIST = "glm53_kit_kvgeometry-1.0.dist-info"


def write_entry_point(directory: Path = ENTRY_DIR) -> Path:
    """The dist-info holding the plugin's entry point (rewritten each time; returns its dir)."""
    group, name, target = ENTRY_POINT
    dist = directory / DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: glm53-kit-kvgeometry\nVersion: 1.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n", encoding="utf-8")
    return directory


def plugin_env(environ: Mapping[str, str], directory: Path, kit_root: Path) -> dict[str, str]:
    """PYTHONPATH (and VLLM_PLUGINS, when set) for a server that loads the plugin."""
    paths = [str(directory), str(kit_root)]
    paths += [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    env = {"PYTHONPATH": os.pathsep.join(paths)}
    allowed = environ.get("VLLM_PLUGINS")
    name = ENTRY_POINT[1]
    if allowed is not None and name not in allowed.split(","):
        env["VLLM_PLUGINS"] = ",".join(p for p in (allowed, name) if p)
    return env

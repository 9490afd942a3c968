"""Which compose files a profile's device runs, and the service they add up to.

`compose/compose.yaml` is the GPU service; an overlay per device changes it (`cpu.yaml`: no GPU
reservation, no checkout mount, no locked-memory limit). Compose merges them when it reads
COMPOSE_FILE; the replica renderer needs the same merged service, so this module merges the
overlay the way Compose does for the two tags the overlays use (`!reset`: remove the key,
`!override`: replace instead of merging), and the overlay file stays the one place that says
what a CPU service leaves out.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml

from launch.image_lock import COMPOSE_DIR, COMPOSE_FILE

PROJECT = "glm53"
"""The compose project (`name:` in compose/compose.yaml): its containers carry the label
`com.docker.compose.project=glm53`."""
SERVICE = "vllm"
"""The vLLM service of compose/compose.yaml (`vllm-0`, `vllm-1`, ... when scaled out)."""
KIT_PACKAGES = ("launch", "kvgeometry")
"""The packages compose mounts into an image without the kit (compose/compose.yaml), at
/opt/kit; `make capacity` mounts them the same way."""

DEVICE_OVERLAYS = {"cuda": (), "cpu": ("cpu.yaml",)}
"""compose/ overlays per deployment.device, applied after compose.yaml."""


@dataclass(frozen=True)
class _Override:
    value: Any


_RESET = object()


class _OverlayLoader(yaml.SafeLoader):
    """Safe YAML with Compose's merge tags."""


_OverlayLoader.add_constructor("!reset", lambda loader, node: _RESET)
_OverlayLoader.add_constructor(
    "!override",
    lambda loader, node: _Override(
        loader.construct_sequence(node, deep=True)
        if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node, deep=True)
        if isinstance(node, yaml.MappingNode)
        else loader.construct_scalar(node)
    ),
)


def compose_files(device: str) -> str:
    """COMPOSE_FILE for a device (paths relative to compose/, `:`-separated)."""
    return ":".join((COMPOSE_FILE.name, *DEVICE_OVERLAYS[device]))


def merge(base: Any, overlay: Any) -> Any:
    """Compose's merge of one overlay value into a base value."""
    if isinstance(overlay, _Override):
        return copy.deepcopy(overlay.value)
    if isinstance(base, dict) and isinstance(overlay, dict):
        out = dict(base)
        for key, value in overlay.items():
            if value is _RESET:
                out.pop(key, None)
            else:
                out[key] = merge(base.get(key), value)
        return out
    return copy.deepcopy(overlay)


def merged_document(device: str) -> dict[str, Any]:
    """compose.yaml with the device's overlays applied."""
    doc = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    for name in DEVICE_OVERLAYS[device]:
        overlay = yaml.load((COMPOSE_DIR / name).read_text(encoding="utf-8"), _OverlayLoader)
        doc = merge(doc, overlay)
    return doc

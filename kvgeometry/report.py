"""The geometry of the real KVCacheConfig the engine core planned, as `kvgeometry.line` writes it.

    KV cache geometry: layout=X stride_bytes=S num_blocks=N tokens=T scheduler_block=K
    hash_block=H group=G/ROLE/KIND/block=B/cp=C/layers=L/page_bytes=P ...

X the resolved layout, S the pool stride (the widest group's bytes per block), N the block count,
T the group-aware token capacity vLLM reports, K and H the scheduler's token alignment and the
prefix-cache hash block (`resolve_kv_cache_block_sizes`). One `group=` entry per role in each
group (GLM-5.3's latent and indexer share a group): G the group index; ROLE `latent` (an MLA
latent cache), `indexer` (a sparse-MLA indexer cache), `tail_ring` (a per-request circular
buffer, GLM-5.3's indexer tail), `recurrent` (Mamba/GDN state), `draft`, `attention` or `other`;
KIND the spec kind (`mla`, `mamba`, `full`, `sliding_window`, `circular_buffer`, ...); B tokens
per block on one rank; C the group's effective DCP size (its token span is B x C); L the layers of
that role in the group; P their page bytes.

Fields are read defensively, by name, from whichever vLLM runs (0.32 keeps the planner helpers in
`kv_cache_utils`, 0.33 in `kv_cache_planning`): a value this vLLM cannot give is printed as
`unknown` (None in `KVGeometry`), never guessed. Spec classes are recognised by class name, so a
class one vLLM lacks does not break the report.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from kvgeometry.line import MISSING, PREFIX, UNKNOWN, GeometryGroup, KVGeometry

__all__ = ["HOOK_MISSING", "PREFIX", "UNKNOWN", "format_geometry", "geometry_of"]

HOOK_MISSING = MISSING + "the kit's plugin cannot see the plan (%s)"
"""The WARNING when the engine core's planner call cannot be wrapped; %s says why."""
PLANNER_MODULES = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")
"""Where vLLM keeps the planner helpers, newest first."""
KINDS = {
    "MLAAttentionSpec": "mla",
    "MambaSpec": "mamba",
    "SlidingWindowSpec": "sliding_window",
    "SlidingWindowMLASpec": "sliding_window_mla",
    "FullAttentionSpec": "full",
    "CircularBufferSpec": "circular_buffer",
    "HiddenStateCacheSpec": "hidden_state",
}
"""Spec class name -> KIND; any other class prints its own name."""


def _helper(name: str) -> Callable[..., Any] | None:
    for module_name in PLANNER_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found = getattr(module, name, None)
        if found is not None:
            return found
    return None


def _field(read: Callable[[], Any]) -> Any:
    """`read()`, or UNKNOWN when this vLLM lacks what it reads."""
    try:
        value = read()
    except (AttributeError, KeyError, TypeError, ValueError, ImportError):
        return UNKNOWN
    return UNKNOWN if value is None else value


def _call(name: str, *args: Any) -> Any:
    helper = _helper(name)
    if helper is None:
        return UNKNOWN
    return _field(lambda: helper(*args))


def _classes(spec: Any) -> set[str]:
    return {cls.__name__ for cls in type(spec).__mro__}


def role_and_kind(spec: Any) -> tuple[str, str]:
    """(ROLE, KIND) of one layer's spec."""
    kind = KINDS.get(type(spec).__name__, type(spec).__name__)
    classes = _classes(spec)
    if getattr(spec, "is_draft", False):
        return "draft", kind
    if "MambaSpec" in classes:
        return "recurrent", kind
    if "CircularBufferSpec" in classes:
        return "tail_ring", kind
    if "MLAAttentionSpec" in classes:
        role = getattr(getattr(spec, "cache_role", None), "name", None)
        return ("indexer" if role == "INDEXER" else "latent"), kind
    if "AttentionSpec" in classes:
        return "attention", kind
    return "other", kind


def _layer_spec(group: Any, layer: str) -> Any:
    """The spec of one layer of a group (a group of mixed specs holds one per layer)."""
    spec = group.kv_cache_spec
    per_layer = getattr(spec, "kv_cache_specs", None)
    return per_layer[layer] if isinstance(per_layer, dict) else spec


def _known(value: Any) -> Any:
    return None if value == UNKNOWN else value


def group_entries(index: int, group: Any, dcp: Any) -> list[GeometryGroup]:
    """The entries of one group, one per (role, kind, page size)."""
    spec = group.kv_cache_spec
    counts: dict[tuple[str, str, Any], int] = {}
    for name in group.layer_names:
        layer = _layer_spec(group, name)
        role, kind = role_and_kind(layer)
        key = (role, kind, _field(lambda layer=layer: layer.page_size_bytes))
        counts[key] = counts.get(key, 0) + 1
    block = _known(_field(lambda: spec.block_size))
    sharded = getattr(spec, "dcp_sharded", None)
    entries = []
    for (role, kind, page), layers in counts.items():
        if role in ("recurrent", "other"):
            cp: Any = 1
        elif sharded is None or dcp == UNKNOWN:
            cp = None
        else:
            cp = dcp if sharded else 1
        entries.append(GeometryGroup(index, role, kind, block, cp, layers, _known(page)))
    return entries


def geometry_of(vllm_config: Any, kv_cache_config: Any) -> KVGeometry:
    """This start's plan as the geometry value (see the module docstring)."""
    layout = _field(lambda: vllm_config.cache_config.get_resolved_kv_cache_layout())
    groups = list(kv_cache_config.kv_cache_groups)
    device_groups = [g for g in groups if not getattr(g, "host_resident", False)]
    stride = UNKNOWN if layout == UNKNOWN else _call(
        "_get_kv_cache_bytes_per_block", device_groups, layout
    )  # fmt: skip
    dcp = _field(lambda: vllm_config.parallel_config.decode_context_parallel_size)
    tokens = UNKNOWN
    if getattr(vllm_config, "model_config", None) is not None:
        capacity = _call("get_kv_cache_capacity", vllm_config, kv_cache_config)
        tokens = capacity if capacity == UNKNOWN else capacity[0]
    blocks = _call("resolve_kv_cache_block_sizes", kv_cache_config, vllm_config)
    scheduler, hashed = (UNKNOWN, UNKNOWN) if blocks == UNKNOWN else blocks
    return KVGeometry(
        layout=str(_field(lambda: layout.name)),
        stride_bytes=_known(stride),
        num_blocks=_known(_field(lambda: kv_cache_config.num_blocks)),
        tokens=_known(tokens),
        scheduler_block=_known(scheduler),
        hash_block=_known(hashed),
        groups=tuple(e for i, g in enumerate(groups) for e in group_entries(i, g, dcp)),
    )


def format_geometry(vllm_config: Any, kv_cache_config: Any) -> str:
    """The one line for this start's plan."""
    return geometry_of(vllm_config, kv_cache_config).line()

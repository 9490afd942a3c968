"""Run vLLM's real planner functions on seed-shaped specs (the patched copy)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import vllm.v1.core.kv_cache_planning as planning
from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, resolve_kv_cache_block_sizes
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec

from tests.conftest import REPO
from tests.planner.seed_shapes import TWELVE_GIB


@dataclass(frozen=True)
class Plan:
    groups: list[KVCacheGroupSpec]
    config: KVCacheConfig
    stride: int
    tokens: int | None
    scheduler_block: int

    def block_size_of(self, layer: str) -> int:
        return next(g.kv_cache_spec.block_size for g in self.groups if layer in g.layer_names)

    @property
    def pool_bytes(self) -> int:
        return self.stride * self.config.num_blocks


def plan(config: VllmConfig, specs: dict[str, KVCacheSpec], memory: int = TWELVE_GIB) -> Plan:
    groups = planning.get_kv_cache_groups(config, dict(specs))
    kv_config = planning.get_kv_cache_config_from_groups(config, groups, memory)
    stride = planning._get_kv_cache_bytes_per_block(
        groups, config.cache_config.get_resolved_kv_cache_layout()
    )
    tokens = get_kv_cache_capacity(config, kv_config)[0] if config.model_config else None
    scheduler_block, _ = resolve_kv_cache_block_sizes(kv_config, config)
    return Plan(groups, kv_config, stride, tokens, scheduler_block)


def pristine(function: str, *args: object) -> object:
    """`module:function` run on the installed, unpatched vLLM 0.34.0 in a process of its own
    (one process cannot import two vLLMs); its arguments pickled to it, its result read back
    as JSON."""
    module, name = function.split(":")
    code = ("import importlib, json, pickle, sys\n"
            f"f = getattr(importlib.import_module({module!r}), {name!r})\n"
            "print(json.dumps(f(*pickle.load(open(sys.argv[1], 'rb')))))\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KIT_PATCHED_VLLM")}
    with tempfile.NamedTemporaryFile(suffix=".pkl") as arguments:
        arguments.write(pickle.dumps(args))
        arguments.flush()
        done = subprocess.run([sys.executable, "-c", code, arguments.name], cwd=REPO,
                              env={**env, "PYTHONPATH": "."}, capture_output=True, text=True,
                              timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])

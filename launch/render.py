"""Render a resolved profile to the exact `vllm serve` argv and environment (a pure function).

Flags are derived from the EngineArgs field names (`max_num_seqs` -> `--max-num-seqs`), nested
configs become compact JSON, and fork features become the environment variables vLLM registers
for them (`launch.feature_env`). The result is an argv list, never a shell string.
"""

from __future__ import annotations

import json
from dataclasses import fields

from launch.feature_env import feature_env
from launch.kv_offload import OFF, OFFLOAD_FLAGS
from launch.profile import EngineArgs, KVOffload, Profile
from launch.schema import to_plain

UNRENDERED_ENGINE_FIELDS = ("model", "extra_args", "kv_offload")
"""EngineArgs fields that are not a `--field` flag: the positional model, the pass-through
arguments, and the host tier (rendered as vLLM's two offloading flags)."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def offload_argv(offload: KVOffload | None) -> list[str]:
    if offload is None or offload.backend == OFF:
        return []
    values = (getattr(offload, field) for field in OFFLOAD_FLAGS.values())
    shown = (f"{v:g}" if isinstance(v, float) else v for v in values)  # 32.0 renders as 32
    return [arg for pair in zip(OFFLOAD_FLAGS, shown, strict=True) for arg in pair]


def engine_argv(engine: EngineArgs) -> list[str]:
    """`vllm serve MODEL --flag value ...` from the engine arguments, in field order."""
    argv = ["vllm", "serve", engine.model]
    for f in fields(engine):
        if f.name in UNRENDERED_ENGINE_FIELDS:
            continue
        value = getattr(engine, f.name)
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag(f.name) if value else flag(f"no_{f.name}"))
        elif isinstance(value, dict) or hasattr(value, "__dataclass_fields__"):
            argv += [flag(f.name), json.dumps(to_plain(value), separators=(",", ":"))]
        else:
            argv += [flag(f.name), str(value)]
    return [*argv, *offload_argv(engine.kv_offload), *engine.extra_args]


def serve_argv(p: Profile) -> list[str]:
    """The whole `vllm serve` command line of a resolved profile."""
    d = p.deployment
    return [*engine_argv(p.engine), flag("host"), d.host, flag("port"), str(d.port),
            flag("shutdown_timeout"), str(d.drain_s)]


def serve_env(p: Profile) -> dict[str, str]:
    """The environment `vllm serve` starts with: the GPUs (unless the runtime picked them) and
    the variables of the profile's fork features."""
    env = {}
    if p.deployment.device == "cuda" and not p.deployment.gpus_from_runtime:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, p.deployment.gpu_devices))
    return env | feature_env(p.features)


def rendered_flags() -> dict[str, str]:
    """Every flag the renderer writes itself -> the profile path it comes from (a pass-through
    argument may not set one of them a second time)."""
    flags = {flag(f.name): f"engine.{f.name}" for f in fields(EngineArgs)
             if f.name not in UNRENDERED_ENGINE_FIELDS}  # fmt: skip
    flags |= {flag("host"): "deployment.host", flag("port"): "deployment.port",
              flag("shutdown_timeout"): "deployment.drain_s"}
    return flags | {name: f"engine.kv_offload.{field}" for name, field in OFFLOAD_FLAGS.items()}

"""Render a resolved profile to the exact `vllm serve` argv and environment (a pure function).

Flags are derived from the EngineArgs field names (`max_num_seqs` -> `--max-num-seqs`), nested
configs become compact JSON, and fork features become the environment variables vLLM registers
for them (`launch.feature_env`). The result is an argv list, never a shell string.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import fields
from typing import TYPE_CHECKING

from launch.feature_env import feature_env
from launch.kv_offload import OFF, OFFLOAD_FLAGS
from launch.profile import EngineArgs, KVOffload, Profile
from launch.schema import to_plain

if TYPE_CHECKING:
    from launch.plan import Plan

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


def plan_header(plan: Plan) -> list[str]:
    """The plan's comment lines: profile, image, capability check, deviations, placement."""
    lines = [f"# profile: {plan.profile.name} - {plan.profile.summary}"]
    if plan.image:
        lines.append(f"# image: {plan.image}")
    if plan.checked_against:
        lines.append(f"# capabilities checked against {plan.checked_against}")
        lines += [f"# expected at start: {w}" for w in plan.expected_warnings()]
    else:
        lines.append("# capabilities not checked: no vLLM here (`launch run` checks in the image)")
    if plan.qualified:
        lines.append("# qualified: no deviation from the profile")
    else:
        lines.append("# DEVIATIONS from the qualified profile:")
        lines += [f"#   {d}" for d in plan.deviations]
    if plan.placement:
        lines.append("# placement (where it runs; does not affect qualification):")
        lines += [f"#   {d}" for d in plan.placement]
    return lines


def format_plan(plan: Plan) -> str:
    """A copyable, readable shell rendering of the plan (display only; `run` execs the argv)."""
    lines = plan_header(plan)
    expect = to_plain(plan.profile.expect)
    expect.pop("sources", None)
    lines.append(f"# expect: {json.dumps(expect, separators=(', ', ': '))}")
    lines.append("env \\")
    lines += [f"  {k}={shlex.quote(v)} \\" for k, v in plan.env.items()]
    argv = list(plan.argv)
    head, rest = argv[:3], argv[3:]
    lines.append("  " + shlex.join(head) + (" \\" if rest else ""))
    pairs: list[str] = []
    i = 0
    while i < len(rest):
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            pairs.append(shlex.join(rest[i : i + 2]))
            i += 2
        else:
            pairs.append(shlex.quote(rest[i]))
            i += 1
    lines += [f"    {part} \\" for part in pairs[:-1]]
    if pairs:
        lines.append(f"    {pairs[-1]}")
    return "\n".join(lines)

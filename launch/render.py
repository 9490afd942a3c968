"""Render a resolved profile to the exact `vllm serve` argv and environment (a pure function).

Flags are derived from the EngineArgs field names (`max_num_seqs` -> `--max-num-seqs`), nested
configs become compact JSON, and fork features become the environment variables vLLM registers
for them (`launch.capabilities.feature_env`). The result is an argv list, never a shell string.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, fields
from typing import Any

from launch.capabilities import Resolution, feature_env
from launch.deviations import Changed, Deviation, FellBack, NotChecked
from launch.kv_offload import OFF, OFFLOAD_FLAGS
from launch.loader import Loaded, drop_expectations
from launch.profile import EngineArgs, KVOffload, Profile
from launch.schema import to_plain


@dataclass(frozen=True)
class Plan:
    """Exactly what `launch run` will execute, and what the start must show."""

    profile: Profile
    argv: tuple[str, ...]
    env: dict[str, str]
    deviations: tuple[Deviation, ...]
    checked_against: str | None
    placement: tuple[Changed, ...] = ()
    image: str | None = None
    """Which image runs it (source, lock key, digest), when a lock is at hand."""

    @property
    def qualified(self) -> bool:
        return not self.deviations

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "argv": list(self.argv),
            "env": dict(self.env),
            "expect": to_plain(self.profile.expect),
            "deviations": [str(d) for d in self.deviations],
            "placement": [str(c) for c in self.placement],
            "qualified": self.qualified,
            "checked_against": self.checked_against,
            "image": self.image,
        }


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
        if f.name in ("model", "extra_args", "kv_offload"):
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


def render(loaded: Loaded, resolution: Resolution) -> Plan:
    """The plan for `resolution.profile` (the loaded profile after any allowed fallbacks)."""
    p = resolution.profile
    deviations: list[Deviation] = list(loaded.deviations)
    dropped: dict[str, str] = {}
    for req in resolution.fallbacks:
        deviations.append(FellBack(req.field, req.value, req.needs, req.name, req.fallback))
        for field in req.expect_dropped:
            dropped.setdefault(field, f"fallback {req.name}")
    dropped = {k: v for k, v in dropped.items() if k in p.expect.set_fields()}
    deviations += [NotChecked(k, v) for k, v in sorted(dropped.items())]
    p = dataclasses.replace(p, expect=drop_expectations(p.expect, dropped))
    argv = [
        *engine_argv(p.engine),
        *(flag("host"), p.deployment.host, flag("port"), str(p.deployment.port)),
    ]
    env = {}
    if p.deployment.device == "cuda" and not p.deployment.gpus_from_runtime:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, p.deployment.gpu_devices))
    env.update(feature_env(p.features))
    return Plan(p, tuple(argv), env, tuple(deviations), resolution.checked_against,
                loaded.placement)  # fmt: skip


def plan_header(plan: Plan) -> list[str]:
    """The plan's comment lines: profile, image, capability check, deviations, placement."""
    lines = [f"# profile: {plan.profile.name} - {plan.profile.summary}"]
    if plan.image:
        lines.append(f"# image: {plan.image}")
    if plan.checked_against:
        lines.append(f"# capabilities checked against {plan.checked_against}")
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

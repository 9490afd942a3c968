"""The plan: exactly what `launch run` executes and what the start must show, and the one path
to it from a profile name and the user's settings (compose/.env, the environment, `--set`):
load and validate, capability check, render, the image it runs. The launch commands and the
smoke commands all call `plan_for`, so smoke verifies the very object launch renders."""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from typing import Any

from launch.capabilities import Resolution, resolve
from launch.deviations import Changed, Deviation, FellBack, NotChecked
from launch.image_lock import describe_image
from launch.loader import Loaded, drop_expectations, load
from launch.overrides import from_environment, from_set_args
from launch.profile import Profile
from launch.render import serve_argv, serve_env
from launch.route_guard import MIDDLEWARE
from launch.schema import to_plain
from launch.settings import ENV_FILE, Settings
from launch.vllm_install import VllmInstall


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
    unregistered: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Variables it sets that the checked vLLM reads without registering (`Resolution`)."""

    def expected_warnings(self) -> list[str]:
        """What the start will warn that is expected, as the plan prints it."""
        return [f"vLLM warns \"Unknown vLLM environment variable detected: {name}\": it reads "
                f"{name} straight from the environment ({', '.join(modules)}) without "
                "registering it in envs.py"
                for name, modules in self.unregistered.items()]  # fmt: skip

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
            "expected_warnings": self.expected_warnings(),
            "image": self.image,
        }


def assemble(loaded: Loaded, resolution: Resolution) -> Plan:
    """The plan for `resolution.profile` (the loaded profile after any allowed fallbacks): the
    fallbacks become deviations and drop the expectations they invalidate."""
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
    return Plan(p, tuple(serve_argv(p)), serve_env(p), tuple(deviations),
                resolution.checked_against, loaded.placement,
                unregistered=resolution.unregistered)  # fmt: skip


def plan_for(settings: Settings, profile: str | None = None,
             install: VllmInstall | None = None) -> Plan:  # fmt: skip
    """The profile (`profile`, else PROFILE) with compose/.env, then the environment, then
    `--set` (each later source wins, every override names where it came from), checked against
    `install` when one is given."""
    overrides = (
        from_environment(settings.env_file, ENV_FILE)
        + from_environment(settings.environ)
        + from_set_args(settings.sets)
    )
    loaded = load(settings.profile_name(profile), overrides)
    plan = assemble(loaded, resolve(loaded.profile, install))
    # with an API key set, vLLM loads the kit's guard of every route (vLLM's own --api-key
    # guards only some paths); the key itself stays in its file
    argv = (*plan.argv, "--middleware", MIDDLEWARE) if settings.api_key() else plan.argv
    return dataclasses.replace(plan, argv=argv, image=describe_image(
        plan.profile.deployment.image, settings.merged))  # fmt: skip


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

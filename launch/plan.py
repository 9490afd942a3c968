"""The one path from a profile name to a plan: overrides (compose/.env, the environment,
`--set`), load and validate, capability check, render, the image it runs. The launch commands and
the smoke check both start here, so smoke verifies the very object launch renders."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from launch.capabilities import VllmInstall, resolve
from launch.image_lock import describe_image
from launch.loader import load
from launch.overrides import from_environment, from_set_args
from launch.render import Plan, render


def build_plan(
    name: str,
    sets: Sequence[str],
    environ: Mapping[str, str],
    install: VllmInstall | None,
    env_file: Mapping[str, str] | None = None,
) -> Plan:
    """The profile, then compose/.env (`env_file`), then the environment, then `--set`: each
    later source wins, and every override names where it came from."""
    overrides = (
        from_environment(env_file or {}, "compose/.env")
        + from_environment(environ)
        + from_set_args(sets)
    )
    loaded = load(name, overrides)
    plan = render(loaded, resolve(loaded.profile, install))
    image = describe_image(plan.profile.deployment.image, {**(env_file or {}), **environ})
    return dataclasses.replace(plan, image=image)



"""The shared path from a profile name to a plan: overrides, load, capability check, render."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence

from launch.capabilities import VllmInstall, find_vllm, resolve
from launch.compose_env import user_settings
from launch.errors import ProfileError
from launch.image_lock import describe_image
from launch.loader import load
from launch.overrides import from_environment, from_set_args
from launch.render import Plan, render


def add_profile_arguments(
    parser: argparse.ArgumentParser, *, profile_optional: bool = False
) -> None:
    parser.add_argument(
        "profile",
        nargs="?" if profile_optional else None,
        help="profile name (see `python -m launch list`)"
        + ("; defaults to $PROFILE" if profile_optional else ""),
    )
    add_set_argument(parser)
    parser.add_argument(
        "--vllm-root",
        default=None,
        help="vLLM package directory to check capabilities against; `run` defaults to the "
        "importable vLLM, `render` checks only when this is given (the host's vLLM is not the "
        "image's)",
    )


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """`--set KEY=VALUE`, shared by every command that loads a profile."""
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting by variable name (MAX_NUM_SEQS=16) or path "
        "(engine.max_num_seqs=16); repeatable",
    )


def profile_name(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    name = args.profile or environ.get("PROFILE")
    if not name:
        raise ProfileError(
            "profile",
            None,
            "no profile given",
            "pass a profile name or set PROFILE (see `python -m launch list`)",
        )
    return name


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


def plan_from_args(args: argparse.Namespace, *, require_vllm: bool = False) -> Plan:
    environ = os.environ
    install = find_vllm(args.vllm_root) if (require_vllm or args.vllm_root) else None
    if require_vllm and install is None:
        raise ProfileError(
            "vllm",
            None,
            "is not installed here, so capabilities cannot be checked",
            "run inside the kit's image, or use `python -m launch render` to inspect",
        )
    env_file = user_settings()
    name = profile_name(args, {**env_file, **environ})
    return build_plan(name, args.sets, environ, install, env_file)

"""What the launch commands share: their profile arguments, and a plan from parsed arguments
(the plan itself is `launch.plan.build_plan`, which smoke uses too)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from launch.capabilities import VllmInstall, find_vllm
from launch.cli_args import add_set_argument
from launch.compose_env import user_settings
from launch.errors import ProfileError
from launch.plan import build_plan
from launch.render import Plan


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


def plan_from_args(args: argparse.Namespace, *, require_vllm: bool = False) -> Plan:
    install = find_vllm(args.vllm_root) if (require_vllm or args.vllm_root) else None
    if require_vllm and install is None:
        raise ProfileError(
            "vllm",
            None,
            "is not installed here, so capabilities cannot be checked",
            "run inside the kit's image, or use `python -m launch render` to inspect",
        )
    return _plan(args, install)


def _plan(args: argparse.Namespace, install: VllmInstall | None) -> Plan:
    """The profile argument (or PROFILE) with compose/.env, the environment and `--set`."""
    env_file = user_settings()
    name = profile_name(args, {**env_file, **os.environ})
    return build_plan(name, args.sets, os.environ, install, env_file)


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-sets",
        default=os.environ.get("GPU_SETS"),
        help='one replica per set behind the router, e.g. "0,1,2,3 4,5,6,7" (GPU_SETS)',
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="CPU profiles: this many replicas behind the router (GPU profiles use --gpu-sets)",
    )


def compose_plan(args: argparse.Namespace) -> Plan:
    """The plan the compose commands run, unchecked against a vLLM (the host's is not the
    image's; the container's launcher checks its own)."""
    return _plan(args, None)

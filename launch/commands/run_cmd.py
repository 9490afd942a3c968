"""`python -m launch run PROFILE`: validate, check capabilities, then become `vllm serve`.

The process replaces itself (exec), so the container runtime's signals reach vLLM directly and
vLLM's exit status is the container's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from launch.commands.common import add_profile_arguments, vllm_to_check
from launch.errors import UsageError
from launch.image_lock import KIT_ROOT
from launch.kv_offload import read_host_memory
from launch.plan import format_plan, plan_for
from launch.plugin import plugin_env, write_entry_point
from launch.settings import read_settings, refuse_secrets_as_environment
from launch.validate import check_host_memory
from launch.vllm_argv import parse_with_vllm

NAME = "run"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="validate a profile and exec vllm serve")
    add_profile_arguments(parser, profile_optional=True)
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would run and exit without starting it"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    install = vllm_to_check(args.vllm_root, required=True)
    settings = read_settings(args.sets)
    # a secret in the server's environment is readable by `docker inspect`: refused, not served
    refuse_secrets_as_environment(settings.environ, "the server's environment")
    plan = plan_for(settings, args.profile, install)
    check_host_memory(plan.profile, read_host_memory())
    if plan.profile.engine.extra_args:
        parse_with_vllm(plan.argv, plan.profile.engine.extra_args)
    print(format_plan(plan), file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    executable = shutil.which(plan.argv[0])
    if executable is None:
        raise UsageError(
            "argv[0]",
            plan.argv[0],
            "is not on PATH",
            "install vLLM in this environment or run inside the kit's image",
        )
    # The kit's geometry plugin (kvgeometry, beside launch/ on the kit's path) in every image.
    extra = plugin_env(os.environ, write_entry_point(), KIT_ROOT)
    print(f"# geometry plugin: kvgeometry via {extra['PYTHONPATH']}", file=sys.stderr, flush=True)
    os.execve(executable, list(plan.argv), {**os.environ, **plan.env, **extra})
    return 0  # pragma: no cover - execve does not return

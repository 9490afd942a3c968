"""User overrides: the environment variable names people already use, or `--set key=value`.

An override changes the raw profile data before it is built and validated, so an overridden
profile passes exactly the same checks as a shipped one. Every override is recorded as a deviation
from the qualified profile.
"""

from __future__ import annotations

import copy
import difflib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from launch.deviations import Changed
from launch.errors import UsageError
from launch.profile import Profile
from launch.schema import field_paths, hint_at, parse_text
from launch.sizes import PROFILE_SIZES, in_units, read_size
from launch.vllm_vocab import HUMAN_READABLE_INT_FIELDS, human_readable_int

# Environment variable -> profile path. The names are the ones of the seeds' launch scripts.
ENV_OVERRIDES: dict[str, str] = {
    "TP": "engine.tensor_parallel_size",
    "PP": "engine.pipeline_parallel_size",
    "DCP": "engine.decode_context_parallel_size",
    "CP_KV_CACHE_INTERLEAVE_SIZE": "engine.cp_kv_cache_interleave_size",
    "MAX_MODEL_LEN": "engine.max_model_len",
    "MAX_NUM_SEQS": "engine.max_num_seqs",
    "MAX_NUM_BATCHED_TOKENS": "engine.max_num_batched_tokens",
    "KV_CACHE_MEMORY": "engine.kv_cache_memory_bytes",
    "GPU_MEMORY_UTILIZATION": "engine.gpu_memory_utilization",
    "KV_CACHE_DTYPE": "engine.kv_cache_dtype",
    "MODEL_REVISION": "engine.revision",
    "SERVED_MODEL_NAME": "engine.served_model_name",
    "ATTENTION_BACKEND": "engine.attention_backend",
    "MOE_BACKEND": "engine.moe_backend",
    "LINEAR_BACKEND": "engine.linear_backend",
    "CUDAGRAPH_MODE": "engine.compilation_config.cudagraph_mode",
    "MAX_CUDAGRAPH_CAPTURE_SIZE": "engine.compilation_config.max_cudagraph_capture_size",
    "SPECULATOR": "engine.speculative_config.method",
    "NUM_SPECULATIVE_TOKENS": "engine.speculative_config.num_speculative_tokens",
    "DFLASH_MODEL_REVISION": "engine.speculative_config.revision",
    "DFLASH_ATTENTION_BACKEND": "engine.speculative_config.attention_backend",
    "DFLASH_KV_CACHE_DTYPE": "engine.speculative_config.kv_cache_dtype",
    "B12X_PCIE_ALLREDUCE": "features.b12x_pcie_allreduce",
    "DCP_CKV_GATHER": "features.dcp_ckv_gather",
    "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE": "features.split_pages.target_block_size",
    "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE": "features.split_pages.mamba_block_size",
    "GPU_DEVICES": "deployment.gpu_devices",
    "GPUS_FROM_RUNTIME": "deployment.gpus_from_runtime",
    "IMAGE_SOURCE": "deployment.image",
    "HOST": "deployment.host",
    "PORT": "deployment.port",
    "SHM_SIZE_GIB": "deployment.shm_size_gib",
    "STARTUP_BUDGET_S": "deployment.startup_budget_s",
    "DRAIN_S": "deployment.drain_s",
    "ALLOW_FLOATING_REVISION": "deployment.allow_floating_revision",
    "FALLBACKS": "deployment.fallbacks",
    "VLLM_EXTRA_ARGS": "engine.extra_args",
    "REASONING_PARSER": "engine.reasoning_parser",
    "TOOL_CALL_PARSER": "engine.tool_call_parser",
    "ENABLE_AUTO_TOOL_CHOICE": "engine.enable_auto_tool_choice",
    "ENABLE_PREFIX_CACHING": "engine.enable_prefix_caching",
    "CACHE_MODE": "engine.kv_offload.backend",
    "KV_OFFLOADING_SIZE_GB": "engine.kv_offload.size_gib",
}

# Where and how the container runs, not what the engine computes: changing one is shown, but
# never makes a run unqualified (the image, fallbacks and floating revisions do). The smoke
# check's own settings (`smoke.*`) are shown the same way. Matched as path prefixes.
PLACEMENT_PATHS = (
    "deployment.gpu_devices",
    "deployment.gpus_from_runtime",
    "deployment.host",
    "deployment.port",
    "deployment.shm_size_gib",
    "deployment.startup_budget_s",
    "deployment.drain_s",
    "smoke.",
)

# Paths a user may not override: they name the profile or its evidence, not a setting.
_FIXED_PREFIXES = ("name", "summary", "sources", "expect", "architecture")


@dataclass(frozen=True)
class Override:
    """One requested change: profile path, raw text, and where it came from."""

    path: str
    text: str
    origin: str


def settable_paths() -> list[str]:
    """Every profile path an override may set."""
    return [p for p in field_paths(Profile) if not p.startswith(_FIXED_PREFIXES)]


def from_environment(environ: Mapping[str, str], origin: str = "environment") -> list[Override]:
    """Overrides from the known variable names present in `environ` (the process environment,
    or the user's lines of compose/.env with origin "compose/.env")."""
    return [
        Override(path, environ[name], f"{origin} {name}")
        for name, path in ENV_OVERRIDES.items()
        if name in environ
    ]


def from_set_args(items: Iterable[str]) -> list[Override]:
    """Overrides from `--set key=value`; key is a profile path or a known environment name."""
    out = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError("--set", item, "must be key=value", "e.g. --set MAX_NUM_SEQS=16")
        path = ENV_OVERRIDES.get(key, key)
        if path not in settable_paths():
            close = difflib.get_close_matches(key, [*ENV_OVERRIDES, *settable_paths()], n=1)
            raise UsageError(
                "--set",
                item,
                f"'{key}' is not a settable profile path or known variable",
                f"did you mean '{close[0]}'?"
                if close
                else f"use one of {', '.join(sorted(ENV_OVERRIDES))}, or a path such as "
                "engine.max_num_seqs",
            )
        out.append(Override(path, text, f"--set {key}"))
    return out


def split_args(text: str, origin: str) -> list[str]:
    """`VLLM_EXTRA_ARGS` split as a shell splits a command line."""
    try:
        return shlex.split(text)
    except ValueError as err:  # an unbalanced quote, a trailing backslash
        raise UsageError(f"{origin} (engine.extra_args)", text,
                         f"cannot be split as a shell would ({err})",
                         "balance the quotes, e.g. VLLM_EXTRA_ARGS=\"--seed 7\"") from err


def human_size(text: str, path: str, where: str) -> str:
    """The number text of a size (`launch.sizes`, in the field's own unit) or of a count (vLLM's
    suffixes), or `text` unchanged when it is unset or a plain integer already; a usage error
    naming the forms otherwise."""
    if text.strip().lower() in ("", "none", "null"):
        return text  # unset: the schema judges it
    if path in PROFILE_SIZES:
        field = PROFILE_SIZES[path]
        return str(in_units(read_size(field, text, where), field.unit))
    count = human_readable_int(text)
    if count is not None:
        return str(count)
    if re.fullmatch(r"[+-]?\d+", text.strip()):
        return text  # an integer: the schema judges it
    raise UsageError(where, text, "is not a count vLLM reads",
                     "give a whole number: 262144, 256K (x 1024) or 262k (x 1000)")


def apply(
    raw: Mapping[str, Any], overrides: Iterable[Override]
) -> tuple[dict[str, Any], list[Changed], list[Changed]]:
    """Apply overrides to raw profile data; return the new data, the deviations from the
    qualified profile and the placement changes (`PLACEMENT_PATHS`)."""
    data: dict[str, Any] = copy.deepcopy(dict(raw))
    deviations: list[Changed] = []
    placement: list[Changed] = []
    for ov in overrides:
        text = ov.text
        field = ov.path.rsplit(".", 1)[-1]
        if field in HUMAN_READABLE_INT_FIELDS or ov.path in PROFILE_SIZES:
            text = human_size(text, ov.path, f"{ov.origin} ({ov.path})")
        if ov.path == "engine.extra_args":
            value: Any = split_args(text, ov.origin)
        else:
            value = parse_text(hint_at(Profile, ov.path), text, f"{ov.origin} ({ov.path})")
        parts = ov.path.split(".")
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            node = child
        old = node.get(parts[-1])
        if old == value or (isinstance(old, list) and value == list(old)):
            continue
        node[parts[-1]] = value
        change = Changed(ov.path, old, value, ov.origin)
        (placement if ov.path.startswith(PLACEMENT_PATHS) else deviations).append(change)
    return data, deviations, placement

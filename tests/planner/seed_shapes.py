"""HAND-WRITTEN KV cache specs shaped like seed 004's pages, for vLLM's real planner on the CPU.

These are not the specs vLLM builds for GLM-5.3: it builds three per sparse-MLA layer (the 528-byte
latent, the C4 indexer cache and the tail ring; ../shared/notes/glm53-geometry.md), where these fold
latent and indexer into one 561-byte-per-token MLA spec, the seed's page. They check what the series
promises at the seed's page sizes; the specs vLLM's own layer classes build are
capacity/glm53_specs.py's (tests/planner/test_glm53_real_specs.py). Figures: 45 layers, a sparse-
MLA layer at every fourth position from index 3 (11 MLA layers, 34 gated-delta layers); 561 bytes
per token, so 287,232 bytes at 512 tokens and 1,292,544 at 2,304; the TP4 recurrent page of
1,048,576 SSM bytes plus the convolution state of 3 x 6,144 FP32 values for MTP (1,122,304 bytes).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import KVCacheSpec, MambaSpec, MLAAttentionSpec

from capacity.glm53_specs import KV_LAYOUT
from launch.glm53 import GLM53, RUNTIME_TARGET_BLOCK

NUM_LAYERS = 45
MLA_BYTES_PER_TOKEN = 561
SSM_SHAPE = (16, 128, 128)
CONV_ROWS = {"mtp": 3, "dflash": 5}
TWELVE_GIB = 12_884_901_888


def vllm_config(
    *, dcp: int = 1, architecture: str | None = GLM53, max_model_len: int = 1_048_576
) -> VllmConfig:
    """A VllmConfig the planner accepts without a model checkpoint."""
    config = VllmConfig()
    config.parallel_config.decode_context_parallel_size = dcp
    config.cache_config.kv_cache_layout = KV_LAYOUT
    config.cache_config.mamba_cache_mode = "align"
    if architecture is not None:
        config.model_config = SimpleNamespace(
            architecture=architecture,
            use_mla=True,
            supports_kv_cache_grouping=False,  # GLM-5.3 declares no grouping of its own
            max_model_len=max_model_len,
            original_max_model_len=max_model_len,
        )
    return config


def mla(block_size: int, *, dcp_sharded: bool = True) -> MLAAttentionSpec:
    return MLAAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=MLA_BYTES_PER_TOKEN,
        dtype=torch.uint8,
        dcp_sharded=dcp_sharded,
    )


def recurrent(block_size: int, speculator: str, *, padded_to: int | None = None) -> MambaSpec:
    return MambaSpec(
        block_size=block_size,
        shapes=((CONV_ROWS[speculator], 6144), SSM_SHAPE),
        dtypes=(torch.float32, torch.float32),
        mamba_cache_mode="align",
        page_size_padded=padded_to,
    )


def glm53_target(
    block_size: int, speculator: str, *, mamba_block: int | None = None, dcp_sharded: bool = True
) -> dict[str, KVCacheSpec]:
    specs: dict[str, KVCacheSpec] = {}
    for i in range(NUM_LAYERS):
        if i % 4 == 3:
            specs[f"model.layers.{i}.self_attn"] = mla(block_size, dcp_sharded=dcp_sharded)
        else:
            specs[f"model.layers.{i}.linear_attn"] = recurrent(
                mamba_block or block_size, speculator
            )
    return specs


def mtp_auto_alignment() -> dict[str, KVCacheSpec]:
    """Seed 004's control: vLLM's hybrid alignment promotes the target block to 2,304 tokens
    and pads each recurrent page to the 2,304-token MLA page (what the platform step does)."""
    specs: dict[str, KVCacheSpec] = {}
    page = RUNTIME_TARGET_BLOCK * MLA_BYTES_PER_TOKEN
    for i in range(NUM_LAYERS):
        if i % 4 == 3:
            specs[f"model.layers.{i}.self_attn"] = mla(RUNTIME_TARGET_BLOCK, dcp_sharded=False)
        else:
            specs[f"model.layers.{i}.linear_attn"] = recurrent(
                RUNTIME_TARGET_BLOCK, "mtp", padded_to=page
            )
    return specs


def mtp_split_seed() -> dict[str, KVCacheSpec]:
    """Seed 004's qualified split geometry: 512-token target and recurrent pages."""
    return glm53_target(512, "mtp")

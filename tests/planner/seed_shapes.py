"""KV cache specs shaped like the seed configurations, for vLLM's real planner on the CPU.

Figures from ../shared/notes/glm53-geometry.md, each checked there against the seeds: 45 layers,
an indexed-attention (sparse MLA) layer at every fourth position from index 3 (11 MLA layers,
34 gated-delta layers); the FP8 sparse-MLA page of 561 bytes per token (512 latent + 16 scales +
33 packed C4 indexer bytes), so 287,232 bytes at 512 tokens and 1,292,544 at 2,304; the TP4
recurrent page of 1,048,576 SSM bytes plus the convolution state: 3 x 6,144 FP32 values for MTP
(1,122,304 bytes) and 5 x 6,144 for DFlash (1,171,456 bytes).

The seeds give the DFlash draft's backend block (1,152 tokens) but not its attention shape; the
draft here is one sliding-window layer of 8 KV heads x 128 (bf16) with a 2,048-token window, a
stand-in chosen so its pages are smaller than the target stride. Tests vary it both ways.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

GLM53 = "Glm5NextForConditionalGeneration"
NUM_LAYERS = 45
MLA_BYTES_PER_TOKEN = 561
SSM_SHAPE = (16, 128, 128)
CONV_ROWS = {"mtp": 3, "dflash": 5}
TWELVE_GIB = 12_884_901_888
DFLASH_DRAFT_BLOCK = 1152
DFLASH_TARGET_BLOCK = 2304


def vllm_config(
    *, dcp: int = 1, architecture: str | None = GLM53, max_model_len: int = 1_048_576
) -> VllmConfig:
    """A VllmConfig the planner accepts without a model checkpoint."""
    config = VllmConfig()
    config.parallel_config.decode_context_parallel_size = dcp
    config.cache_config.kv_cache_layout = "BLNHC"
    config.cache_config.mamba_cache_mode = "align"
    if architecture is not None:
        config.model_config = SimpleNamespace(
            architecture=architecture,
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


def draft_window(
    block_size: int = DFLASH_DRAFT_BLOCK, *, heads: int = 8, window: int = 2048
) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=heads,
        head_size=128,
        dtype=torch.bfloat16,
        sliding_window=window,
        dcp_sharded=False,
        is_draft=True,
    )


def draft_full(block_size: int = DFLASH_DRAFT_BLOCK) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size,
        num_kv_heads=8,
        head_size=128,
        dtype=torch.bfloat16,
        dcp_sharded=False,
        is_draft=True,
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


def dflash_seed(draft: KVCacheSpec | None = None) -> dict[str, KVCacheSpec]:
    """Seed 000's cache: target at the automatic 2,304-token alignment plus the draft."""
    specs = glm53_target(DFLASH_TARGET_BLOCK, "dflash")
    specs["draft.layers.0.self_attn"] = draft if draft is not None else draft_window()
    return specs


def mtp_auto_alignment() -> dict[str, KVCacheSpec]:
    """Seed 004's control: vLLM's hybrid alignment promotes the target block to 2,304 tokens
    and pads each recurrent page to the 2,304-token MLA page (what the platform step does)."""
    specs: dict[str, KVCacheSpec] = {}
    page = DFLASH_TARGET_BLOCK * MLA_BYTES_PER_TOKEN
    for i in range(NUM_LAYERS):
        if i % 4 == 3:
            specs[f"model.layers.{i}.self_attn"] = mla(DFLASH_TARGET_BLOCK, dcp_sharded=False)
        else:
            specs[f"model.layers.{i}.linear_attn"] = recurrent(
                DFLASH_TARGET_BLOCK, "mtp", padded_to=page
            )
    return specs


def mtp_split_seed() -> dict[str, KVCacheSpec]:
    """Seed 004's qualified split geometry: 512-token target and recurrent pages."""
    return glm53_target(512, "mtp")

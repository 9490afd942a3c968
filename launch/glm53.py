"""What the kit knows of GLM-5.3-Flash itself, from its checkpoint and the qualified runtime.

The launcher's checks (`launch.capabilities`, `launch.validate`) and the capacity package's spec
builder (`capacity.glm53_specs`) both read these, so they live below both."""

from __future__ import annotations

GLM53 = "Glm5NextForConditionalGeneration"
"""vLLM's architecture name for GLM-5.3 (the checkpoint's `architectures`)."""
RUNTIME_LATENT_BYTES = 528
"""The qualified runtime's FP8 MLA latent row per token: 512 FP8 bytes and 16 scale bytes (seed
004's 287,232-byte target page at 512 tokens less the indexer's 16,896), for GLM-5.3's
`kv_lora_rank` 512 and `qk_rope_head_dim` 0 (`MLA_SHAPE`). vLLM 0.34.0's SM120 sparse-MLA
backend stores the same row (`get_fp8_ds_mla_row_bytes`); 0.33.0's stored 656."""
MLA_SHAPE = (512, 0)
"""GLM-5.3's (`kv_lora_rank`, `qk_rope_head_dim`): transformers' `Glm5NextTextConfig` defaults,
which `capacity.glm53_specs.text_config` builds on (a test compares the two)."""
RUNTIME_TARGET_BLOCK = 2304
"""The target block the qualified runtime's hybrid alignment gives GLM-5.3 without split pages
(seed 000: '2304 planner alignment' beside the target; seed 004: 'The automatic 2304-token
unified layout'). At 528 bytes a row its latent page (1,216,512 bytes) holds either recurrent
state page, MTP's 1,122,304 or DFlash's 1,171,456."""

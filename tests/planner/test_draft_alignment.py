"""Patch 0001 (seed 000): a DCP-replicated sliding-window draft's block promoted to the sharded
target's, on the patched planner, beside the pristine one (vLLM 0.34.0 as installed, run in a
process of its own: one process cannot import two vLLMs).

The target is GLM-5.3's TP4/DCP4 specs as vLLM's layers build them (capacity/glm53_specs.py,
the runtime's latent rows: seed 000's 906 blocks at 12 GiB). The draft is a STAND-IN: the
DFlash2 checkpoint's config is not at hand, so its layers are vLLM's `SlidingWindowSpec`
(replicated, as vLLM 0.34.0's runner makes a DCP-1 draft's specs) with these values:
- 5 layers: public recipes describe GLM-5.3-Flash-DFlash2 as "qwen3 arch, 5 SWA layers";
- 1,024 bytes per token (2 KV heads of 128, BF16 KV: seed 000 runs the draft with
  DFLASH_KV_CACHE_DTYPE=auto): the per-token size at which vLLM's hybrid rule gives the seed's
  1,152-token draft block (the smallest multiple of 128 tokens whose page holds the 1,171,456-
  byte DFlash recurrent page: 1,171,456 / 1,024 = 1,144 -> 1,152);
- a 2,048-token window (not public; the window moves the per-request blocks, not the rule).
So the token figures here are the stand-in's, not seed 000's 5,688,681 / 5,974,904.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

from capacity.engine_plan import vllm_lines
from capacity.glm53_specs import runtime_latent
from tests.conftest import REPO
from tests.planner.planning import plan
from tests.planner.seed_shapes import TWELVE_GIB, vllm_config

TARGET_BLOCK = 2304
DRAFT_BLOCK = 1152
"""Seed 000: 'Replicated draft block 1152 control', '2304 planner alignment'."""
PLANNING_LOGGER = "vllm.v1.core.kv_cache_planning"
C4_UNIT = 64 * 132
"""Seed 004's packed C4 index-page unit, the indexer cache's block stride alignment."""


def draft(layers: int = 5, block: int = DRAFT_BLOCK, window: int = 2048,
          spec: type = SlidingWindowSpec) -> dict:  # fmt: skip
    extra = {"sliding_window": window} if spec is SlidingWindowSpec else {}
    return {f"draft.model.layers.{i}.self_attn.attn": spec(
        block_size=block, num_kv_heads=2, head_size=128, dtype=torch.bfloat16, is_draft=True,
        dcp_sharded=False, **extra) for i in range(layers)}  # fmt: skip


@pytest.fixture(scope="module")
def target(real_specs):
    return runtime_latent(real_specs["dflash"])


def draft_groups(result) -> list[tuple[int, int]]:
    return [(len(g.layer_names), g.kv_cache_spec.block_size) for g in result.groups
            if any(n.startswith("draft.") for n in g.layer_names)]  # fmt: skip


def planned(specs: dict, dcp: int = 4):
    with vllm_lines(PLANNING_LOGGER) as lines:
        result = plan(vllm_config(dcp=dcp), specs)
    return result, [line for line in lines if "draft cache block" in line]


def pristine(specs: dict, tmp_path) -> dict:
    """The same plan on the installed, unpatched vLLM 0.34.0."""
    path = tmp_path / "specs.pkl"
    path.write_bytes(pickle.dumps(specs))
    code = (
        "import json, pickle\n"
        "from tests.planner.planning import plan\n"
        "from tests.planner.seed_shapes import vllm_config\n"
        f"r = plan(vllm_config(dcp=4), pickle.load(open({str(path)!r}, 'rb')))\n"
        "groups = [(len(g.layer_names), g.kv_cache_spec.block_size) for g in r.groups\n"
        "          if any(n.startswith('draft.') for n in g.layer_names)]\n"
        "print(json.dumps({'blocks': r.config.num_blocks, 'stride': r.stride,\n"
        "                  'tokens': r.tokens, 'scheduler': r.scheduler_block,\n"
        "                  'draft': groups}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KIT_PATCHED_VLLM")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": "."},
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_smaller_dividing_draft_block_takes_the_target_block(target, tmp_path):
    """At 12 GiB: the same 906 blocks and pool stride with or without 0001, the draft's
    block 1,152 -> 2,304, fewer draft blocks per request, more group-aware tokens, the
    scheduler's block LCM unchanged; 0001's line logged once. The pristine planner keeps
    1,152 (so this fails without the patch)."""
    specs = {**target, **draft()}
    result, lines = planned(specs)
    before = pristine(specs, tmp_path)
    assert draft_groups(result) == [(5, TARGET_BLOCK)]
    assert before["draft"] == [[5, DRAFT_BLOCK]]
    assert result.config.num_blocks == before["blocks"] == 906
    assert result.stride == before["stride"] == 14_217_984
    assert result.scheduler_block == before["scheduler"] == 4 * TARGET_BLOCK
    assert result.tokens > before["tokens"]
    assert lines == [f"Aligned replicated draft cache block size [{DRAFT_BLOCK}] -> "
                     f"{TARGET_BLOCK} tokens with the sharded target groups (pool stride "
                     f"{result.stride} bytes kept)."]  # fmt: skip


def test_the_engine_core_logs_the_alignment_and_reports_the_draft_block(target):
    """Through `make capacity`'s path (the engine core's own sizing, the geometry plugin's
    line): the draft role's block is 2,304, the profile's `block_sizes.draft`."""
    from capacity.engine_plan import EnginePlan, engine_plan
    from capacity.glm53_specs import Shape, text_config
    from capacity.glm53_specs import vllm_config as glm_config
    from launch.loader import load

    config = glm_config(Shape(tp=4, dcp=4, spec_tokens=7, block_size=TARGET_BLOCK,
                              max_model_len=1_048_576), text_config())  # fmt: skip
    config.speculative_config = None
    result = engine_plan(config, {**target, **draft()}, TWELVE_GIB)
    assert isinstance(result, EnginePlan), result
    assert result.num_blocks == 906
    assert result.geometry.block_sizes["draft"] == TARGET_BLOCK
    assert load("dflash-tp4-dcp4").profile.expect.block_sizes == {"draft": TARGET_BLOCK}
    assert any(line.startswith("Aligned replicated draft cache block size") for line in
               result.lines)  # fmt: skip


def test_at_dcp_1_the_draft_keeps_its_block(target):
    specs = {**target, **draft()}
    result, lines = planned(specs, dcp=1)
    assert draft_groups(result) == [(5, DRAFT_BLOCK)] and lines == []


def test_replicated_full_attention_keeps_its_block(target):
    result, lines = planned({**target, **draft(spec=FullAttentionSpec)})
    assert draft_groups(result) == [(5, DRAFT_BLOCK)] and lines == []


def test_a_draft_block_that_does_not_divide_the_target_keeps_it(target):
    result, lines = planned({**target, **draft(block=1536)})  # 2,304 % 1,536 = 768
    assert draft_groups(result) == [(5, 1536)] and lines == []


def test_a_promotion_that_would_enlarge_the_pool_keeps_the_block(target):
    """Eight draft layers fit the target's stride at 1,152 tokens (8 x 1,152 x 1,024 bytes) but
    not at 2,304: the draft keeps its block, the pool its 906 blocks, and the line says why
    (the grown stride: 8 x 2,304 x 1,024 bytes in whole C4 units, the indexer's alignment)."""
    result, lines = planned({**target, **draft(layers=8)})
    assert draft_groups(result) == [(8, DRAFT_BLOCK)]
    assert result.stride == 14_217_984 and result.config.num_blocks == 906
    grown = -(-8 * TARGET_BLOCK * 1024 // C4_UNIT) * C4_UNIT
    assert lines == [f"Keeping replicated draft cache block sizes [{DRAFT_BLOCK}]: a "
                     f"{TARGET_BLOCK}-token block would grow the KV cache pool stride from "
                     f"{result.stride} to {grown} bytes."]  # fmt: skip

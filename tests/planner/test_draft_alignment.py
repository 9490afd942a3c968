"""Patch 0001 (seed 000): a DCP-replicated sliding-window draft's block promoted to the sharded
target's, on the patched planner, beside the pristine one (vLLM 0.34.0 as installed, run in a
process of its own: one process cannot import two vLLMs).

The target is GLM-5.3's TP4/DCP4 specs as vLLM's layers build them (capacity/glm53_specs.py,
the runtime's latent rows: seed 000's 906 blocks at 12 GiB). The draft is the DFlash2 STAND-IN
of tests/planner/dflash_as_served.py (5 sliding-window layers, window 2,048, 1,024 bytes per
token per rank, from the checkpoint's public facts; the fork's 1,152-token block). Seed 000's
token figures themselves, in the runtime's layout, are tests/planner/test_capacity_seeds.py's.
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
from vllm.v1.kv_cache_interface import FullAttentionSpec

from capacity.engine_plan import vllm_lines
from capacity.glm53_specs import runtime_latent
from tests.planner.dflash_as_served import DRAFT_BLOCK, TARGET_BLOCK, draft
from tests.planner.figures import SM120_BLOCKS_AT_12_GIB
from tests.planner.planning import plan, pristine
from tests.planner.seed_shapes import TWELVE_GIB, vllm_config

PLANNING_LOGGER = "vllm.v1.core.kv_cache_planning"
C4_UNIT = 64 * 132
"""Seed 004's packed C4 index-page unit, the indexer cache's block stride alignment."""


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


def draft_plan(specs: dict) -> dict:
    """What `pristine` runs on the unpatched vLLM: the pool and the draft's groups."""
    result = plan(vllm_config(dcp=4), specs)
    return {"blocks": result.config.num_blocks, "stride": result.stride,
            "tokens": result.tokens, "scheduler": result.scheduler_block,
            "draft": draft_groups(result)}  # fmt: skip


def test_a_smaller_dividing_draft_block_takes_the_target_block(target):
    """At 12 GiB: the same 906 blocks and pool stride with or without 0001, the draft's
    block 1,152 -> 2,304, fewer draft blocks per request, more group-aware tokens, the
    scheduler's block LCM unchanged; 0001's line logged once. The pristine planner keeps
    1,152 (so this fails without the patch)."""
    specs = {**target, **draft()}
    result, lines = planned(specs)
    before = pristine("tests.planner.test_draft_alignment:draft_plan", specs)
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


def dflash_question(*sets: str):
    """The question `make capacity PROFILE=dflash-tp4-dcp4 IMAGE_SOURCE=kit` asks at 12 GiB."""
    from capacity.host import Budgets, question_for
    from launch.plan import plan_for
    from launch.settings import read_settings

    plan = plan_for(read_settings(("IMAGE_SOURCE=kit", *sets)), "dflash-tp4-dcp4")
    return question_for(plan, Budgets((TWELVE_GIB,), "--budget"), None, 0)


def test_make_capacity_builds_the_draft_with_vllms_attention_layer(real_specs):
    """The engine side of `make capacity` (what runs in the kit's CUDA image) on the dflash
    profile with its target block named: the DFlash2 draft's five layers are vLLM's own
    `Attention` (the profile's FLASH_ATTN, BF16), which in vLLM 0.34.0 takes the target's 2,304
    tokens itself (0001 has nothing to align) and, by vLLM's DFlash speculator config, stays
    replicated (CP 1): 2,304 x 1,024-byte pages. The pool is the target's: with vLLM's SM120
    latent the same blocks as the target alone, 905 at 12 GiB (the runtime's B12X gets 906)."""
    from capacity.answer import EnginePlan
    from capacity.engine import answer, draft_replicated
    from capacity.engine_plan import engine_plan
    from capacity.glm53_specs import DFLASH2, Shape, text_config
    from capacity.glm53_specs import vllm_config as glm_config
    from launch.loader import load

    assert draft_replicated(4)
    with mock.patch.dict(os.environ):  # the answer takes the question's server environment
        said = answer(dflash_question(f"VLLM_EXTRA_ARGS=--block-size {TARGET_BLOCK}"))
    plan = said.plans[0]
    assert isinstance(plan, EnginePlan), plan
    draft_groups = [g for g in plan.geometry.groups if g.role == "draft"]
    assert [(g.layers, g.block_size, g.cp_size, g.page_bytes) for g in draft_groups] == [
        (DFLASH2.layers, TARGET_BLOCK, 1, TARGET_BLOCK * 1024)]
    assert plan.geometry.block_sizes["draft"] == load("dflash-tp4-dcp4").profile.expect.block_sizes[
        "draft"]  # fmt: skip
    config = glm_config(Shape(tp=4, dcp=4, spec_tokens=7, block_size=TARGET_BLOCK,
                              max_model_len=1_048_576), text_config())  # fmt: skip
    config.speculative_config = None
    alone = engine_plan(config, real_specs["dflash"], TWELVE_GIB)
    assert plan.num_blocks == alone.num_blocks == SM120_BLOCKS_AT_12_GIB
    assert not plan.said("Aligned replicated draft cache block size")


def test_make_capacity_without_a_target_block_names_the_fix():
    from capacity.engine import Unsupported, answer

    with mock.patch.dict(os.environ), pytest.raises(
            Unsupported, match=f"VLLM_EXTRA_ARGS='--block-size {TARGET_BLOCK}'"):
        answer(dflash_question())

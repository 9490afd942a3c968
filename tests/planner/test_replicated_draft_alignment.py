"""Patch 0001 on vLLM's real planner: promote a DCP-replicated window draft only when free."""

from __future__ import annotations

import math

from tests.planner.planning import plan, pristine_planner
from tests.planner.seed_shapes import (
    DFLASH_DRAFT_BLOCK,
    DFLASH_TARGET_BLOCK,
    dflash_seed,
    draft_full,
    draft_window,
    glm53_target,
    vllm_config,
)

DRAFT = "draft.layers.0.self_attn"


def both(config, specs):
    after = plan(config, specs)
    with pristine_planner():
        before = plan(config, specs)
    return before, after


def test_seed_000_shape_promotes_the_draft_to_2304_at_906_blocks():
    before, after = both(vllm_config(dcp=4), dflash_seed())
    assert before.block_size_of(DRAFT) == DFLASH_DRAFT_BLOCK
    assert after.block_size_of(DRAFT) == DFLASH_TARGET_BLOCK
    # Seed 000: 12 GiB, 906 physical blocks, before and after.
    assert before.config.num_blocks == after.config.num_blocks == 906
    assert before.stride == after.stride == 11 * 1_292_544


def test_promotion_never_increases_allocated_bytes_and_raises_capacity():
    before, after = both(vllm_config(dcp=4), dflash_seed())
    assert after.pool_bytes == before.pool_bytes
    assert after.tokens > before.tokens


def test_scheduler_lcm_block_does_not_increase():
    before, after = both(vllm_config(dcp=4), dflash_seed())
    assert after.scheduler_block <= before.scheduler_block
    assert after.scheduler_block == math.lcm(DFLASH_TARGET_BLOCK * 4, DFLASH_TARGET_BLOCK)


def test_no_promotion_when_the_backend_block_does_not_divide_the_target_block():
    specs = dflash_seed(draft_window(1536))
    before, after = both(vllm_config(dcp=4), specs)
    assert after.block_size_of(DRAFT) == before.block_size_of(DRAFT) == 1536
    assert after.config.num_blocks == before.config.num_blocks


def test_no_promotion_when_promoted_pages_would_widen_the_pool():
    # 16 heads: 9.4 MB pages at 1152 tokens fit the 14.2 MB stride, 18.9 MB at 2304 would not.
    specs = dflash_seed(draft_window(heads=16))
    before, after = both(vllm_config(dcp=4), specs)
    assert after.block_size_of(DRAFT) == DFLASH_DRAFT_BLOCK
    assert (after.stride, after.config.num_blocks) == (before.stride, before.config.num_blocks)


def test_no_promotion_without_dcp():
    specs = glm53_target(DFLASH_TARGET_BLOCK, "dflash", dcp_sharded=True)
    specs[DRAFT] = draft_window()
    before, after = both(vllm_config(dcp=1), specs)
    assert after.block_size_of(DRAFT) == DFLASH_DRAFT_BLOCK
    assert [g.kv_cache_spec for g in after.groups] == [g.kv_cache_spec for g in before.groups]


def test_no_promotion_for_non_windowed_replicated_attention():
    before, after = both(vllm_config(dcp=4), dflash_seed(draft_full()))
    assert after.block_size_of(DRAFT) == before.block_size_of(DRAFT) == DFLASH_DRAFT_BLOCK


def test_no_promotion_without_mixed_replication_modes():
    specs = glm53_target(DFLASH_TARGET_BLOCK, "dflash", dcp_sharded=False)
    specs[DRAFT] = draft_window()
    before, after = both(vllm_config(dcp=4), specs)
    assert after.block_size_of(DRAFT) == DFLASH_DRAFT_BLOCK
    assert [g.kv_cache_spec for g in after.groups] == [g.kv_cache_spec for g in before.groups]


def test_geometry_report_states_the_promoted_draft(capsys):
    import vllm.v1.core.kv_cache_planning as planning

    from smoke.logparse import parse_lines

    config = vllm_config(dcp=4)
    after = plan(config, dflash_seed())
    line = planning.format_kv_cache_geometry(config, after.config)
    assert line.startswith(f"KV cache geometry: stride_bytes={11 * 1_292_544} num_blocks=906 ")
    facts = parse_lines([f"(EngineCore pid=1) INFO 11-29 10:00:00 [kv_cache_planning.py:1] {line}"])
    geometry = facts["kv_geometry"]
    assert geometry["num_blocks"] == 906
    assert geometry["block_sizes"] == {"draft": 2304, "recurrent": 2304, "target": 2304}
    assert [g["cp_size"] for g in geometry["groups"]] == [1, 1, 1, 4, 1]
    assert geometry["cp_sizes"] == [4, 1]  # attention groups: sharded target, replicated draft
    assert geometry["tokens"] == after.tokens

"""`make capacity`'s sizing (vLLM's engine core, `capacity.engine_plan`) on GLM-5.3's specs as
vLLM 0.34.0's layers build them: the seeds' figures, what differs from them and why, and the
inverse questions' answers checked one byte / one token either side."""

from __future__ import annotations

import pytest

from capacity.engine import largest_context_for, smallest_budget_for
from capacity.engine_plan import EnginePlan, Refused, engine_plan
from capacity.glm53_specs import Shape, runtime_latent, text_config, vllm_config
from tests.planner.dflash_as_served import DRAFT_BLOCK, TARGET_BLOCK
from tests.planner.figures import SM120_BLOCKS_AT_12_GIB
from tests.planner.planning import plan
from tests.planner.seed_shapes import TWELVE_GIB
from tests.planner.seed_shapes import vllm_config as planner_config

GIB = 1 << 30
MILLION = 1_048_576
SEED_000_BLOCKS = {TWELVE_GIB: 906}
"""Seed 000: 'At an identical 12 GiB KV budget and 906 physical blocks'."""
SEED_000_PRODUCTION_GIB = 15.87
"""Seed 000: 'automatic 0.95 memory budgeting reported 15.87 GiB available for KV'."""


def dflash_config():
    config = vllm_config(Shape(tp=4, dcp=4, spec_tokens=7, block_size=2304,
                               max_model_len=MILLION), text_config())  # fmt: skip
    config.speculative_config = None
    config.device_config.device_type = "cuda"
    return config


def engine(config, specs, budget, max_model_len=None) -> EnginePlan:
    result = engine_plan(config, specs, budget, max_model_len)
    assert isinstance(result, EnginePlan), result
    return result


def test_seed_000_blocks_with_the_runtimes_latent_and_with_vllms(real_specs):
    """The engine core on the target's TP4/DCP4 specs. With the runtime's target latent (528-byte
    rows, no 64-row stride alignment: `runtime_latent`) it gives seed 000's 906 blocks at 12 GiB,
    and the same count anywhere in the rounding of '15.87 GiB' as the seed's 7,900,591 tokens
    need (7.53 requests of 159 blocks: 1,198 blocks). vLLM 0.34.0's own SM120 backend stores the
    same rows but aligns the pool stride to 64 of them (33,792 bytes), one C4 unit more per
    block: 905 at 12 GiB. Per request the target's groups take 145 blocks (114 latent+indexer,
    one tail ring, 3 recurrent groups of 2 + 7 speculative + 1 FlashKDA checkpoint); seed 000's
    159 are the runtime's layout with the draft, the next test."""
    runtime = runtime_latent(real_specs["dflash"])
    twelve = engine(dflash_config(), runtime, TWELVE_GIB)
    assert twelve.num_blocks == SEED_000_BLOCKS[TWELVE_GIB]
    assert twelve.geometry.stride_bytes == 14_217_984  # 11 x (1,216,512 + 76,032)
    low, high = (engine(dflash_config(), runtime, int(g * GIB))
                 for g in (SEED_000_PRODUCTION_GIB - 0.005, SEED_000_PRODUCTION_GIB + 0.005))
    assert low.num_blocks == high.num_blocks == 1198
    assert round(twelve.num_blocks / twelve.max_concurrency) == 145
    own = engine(dflash_config(), real_specs["dflash"], TWELVE_GIB)
    assert own.geometry.stride_bytes == twelve.geometry.stride_bytes + 64 * 132
    assert own.num_blocks == SM120_BLOCKS_AT_12_GIB


SEED_000_TOKENS = {DRAFT_BLOCK: 5_688_681, TARGET_BLOCK: 5_974_904}
"""Seed 000: '1152 control 5,688,681 tokens', '2304 planner alignment 5,974,904 tokens'."""
SEED_000_PRODUCTION_TOKENS = 7_900_591
"""Seed 000: '15.87 GiB available for KV and 7,900,591 group-aware engine KV tokens'."""


@pytest.fixture(scope="module")
def dflash_served(tmp_path_factory):
    from tests.planner.dflash_as_served import draft, target

    return {**target(tmp_path_factory.mktemp("dflash-served")), **draft()}


def test_seed_000_tokens_with_and_without_patch_0001(dflash_served):
    """Seed 000's three token figures from vLLM's engine core sizing, the caches laid out as the
    qualified runtime laid them out (tests/planner/dflash_as_served.py says which values are
    vLLM's, which the runtime's, and which the draft stand-in's, and from where). The unpatched
    vLLM 0.34.0 keeps the draft's 1,152-token block: the seed's control. With patch 0001 the
    draft takes 2,304 at the same 906 blocks: the seed's alignment. Without 0001 in the series
    the patched run gives the control's figure and this fails."""
    from tests.planner.dflash_as_served import served_capacity
    from tests.planner.planning import pristine

    budgets = [TWELVE_GIB, int(SEED_000_PRODUCTION_GIB * GIB)]
    patched = served_capacity(dflash_served, budgets)
    control = pristine("tests.planner.dflash_as_served:served_capacity", dflash_served, budgets)
    assert sorted(g[0] for g in patched["groups"]) == [5, 8, 8, 9, 9, 11]  # the seed's 6 groups
    assert (control["draft_block"], patched["draft_block"]) == (DRAFT_BLOCK, TARGET_BLOCK)
    for run in (control, patched):
        at_twelve, at_production = run["budgets"]
        assert at_twelve["blocks"] == SEED_000_BLOCKS[TWELVE_GIB]
        assert at_twelve["tokens"] == SEED_000_TOKENS[run["draft_block"]]
        assert at_production["blocks"] == 1198
    assert patched["budgets"][1]["tokens"] == SEED_000_PRODUCTION_TOKENS
    assert round(patched["budgets"][1]["concurrency"], 2) == 7.53  # seed 000: '7.53 concurrent'
    gain = SEED_000_TOKENS[TARGET_BLOCK] - SEED_000_TOKENS[DRAFT_BLOCK]
    assert (patched["budgets"][0]["tokens"] - control["budgets"][0]["tokens"]) == gain == 286_223


def test_the_engine_core_sizes_as_the_planner_functions(real_specs, split_512):
    """The engine core's own sizing (what `make capacity` runs) and vLLM's planner functions
    called one by one (tests/planner/planning.py) agree on seed 004's split shape."""
    specs = real_specs["mtp3"]
    config = vllm_config(Shape(tp=4, dcp=1, spec_tokens=3, block_size=512), text_config())
    config.speculative_config = None
    by_engine = engine(config, specs, TWELVE_GIB)
    by_functions = plan(planner_config(max_model_len=262_144), specs)
    assert by_engine.num_blocks == by_functions.config.num_blocks
    assert by_engine.geometry.stride_bytes == by_functions.stride
    assert by_engine.tokens == by_functions.tokens
    assert any(line.startswith("Keeping split GLM-5.3 cache groups") for line in by_engine.lines)
    # each planned start logs what a fresh process logs, vLLM's once-only lines included
    again = engine(config, specs, 2 * TWELVE_GIB)
    assert any(line.startswith("Keeping split GLM-5.3 cache groups") for line in again.lines)


def test_a_budget_below_one_block_is_vllms_refusal(real_specs):
    specs = real_specs["dflash"]
    stride = engine(dflash_config(), specs, TWELVE_GIB).geometry.stride_bytes
    refused = engine_plan(dflash_config(), specs, stride - 1)
    assert isinstance(refused, Refused)
    assert "No available memory for the cache blocks" in refused.why


def test_the_inverse_answers_are_tight(real_specs, split_512):
    """The smallest budget for 4 x 262,144 holds them and one byte less does not; the largest
    context one request fits in 12 GiB fits and one token more does not."""
    specs = real_specs["mtp3"]
    config = vllm_config(Shape(tp=4, dcp=1, spec_tokens=3, block_size=512), text_config())
    config.speculative_config = None
    need = smallest_budget_for(config, specs, 4, 262_144, (TWELVE_GIB,)).plan
    assert need.max_concurrency >= 4
    less = engine_plan(config, specs, need.budget - 1)
    assert isinstance(less, Refused) or less.max_concurrency < 4
    longest = largest_context_for(config, specs, TWELVE_GIB)
    assert engine(config, specs, TWELVE_GIB, longest).max_concurrency >= 1
    more = engine_plan(config, specs, TWELVE_GIB, longest + 1)
    assert isinstance(more, Refused) or more.max_concurrency < 1


@pytest.fixture
def split_512(monkeypatch):
    monkeypatch.setenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE", "512")
    monkeypatch.setenv("VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE", "512")


SEED_004 = {"automatic": (4_412_757, 16.83), "split": (1_265_215, 4.83)}
"""Seed 004: 'The MTP3 DCP1 server retained 1,265,215 local KV tokens, or 4.83 concurrent
262,144-token requests. The automatic 2304-token unified layout reported 4,412,757 tokens.'"""
SEED_004_BUDGET = 34_467_924_480
"""A budget (32.10 GiB) at which both figures come out; the seed does not state its budget."""


@pytest.fixture(scope="module")
def mtp3_as_served(tmp_path_factory):
    """Seed 004's server's specs, from vLLM's classes: TP4/DCP1 with the MTP layer's caches
    (the drafter's sparse-MLA layer 45) and the recurrent layers as FlashKDA keeps them (3
    speculative blocks and a prefill-checkpoint block per request); the latent as the runtime
    keeps it (`runtime_latent`: 528-byte rows without the SM120 backend's 64-row alignment)."""
    from capacity.glm53_specs import build

    shape = Shape(tp=4, dcp=1, spec_tokens=3, block_size=512, mtp_layers=1,
                  kda_prefill_backend="flashkda")  # fmt: skip
    return runtime_latent(build(shape, tmp_path_factory.mktemp("mtp3-served")))


def runtime_pages(specs: dict, block: int, recurrent_padded_to: int | None) -> dict:
    """The qualified runtime's caches at `block` tokens: its target page is latent + indexer
    and nothing else (seed 004's 287,232 bytes at 512; the fork logs two physical page sizes,
    target and recurrent, where vLLM has a third cache, the tail ring, which is left out
    here); the recurrent page padded as vLLM's hybrid alignment pads it, when asked."""
    import dataclasses

    from vllm.v1.kv_cache_interface import CircularBufferSpec, MambaSpec

    out = {}
    for name, spec in specs.items():
        if isinstance(spec, CircularBufferSpec):
            continue
        padded = recurrent_padded_to if isinstance(spec, MambaSpec) else None
        out[name] = dataclasses.replace(spec, block_size=block, **(
            {"page_size_padded": padded} if isinstance(spec, MambaSpec) else {}))  # fmt: skip
    return out


def test_seed_004_both_layouts_at_one_budget(mtp3_as_served):
    """Both seed 004 figures from vLLM's planner functions at one budget. The automatic
    layout: vLLM's own grouping of the hybrid-aligned caches (2,304-token blocks, the recurrent
    page padded to the 1,292,544-byte target page): a 24-layer target group and recurrent groups
    of 12, 11 and 11. #535's split layout: that same partition with each cache's own 512-token
    page (#535 'cache grouping preserves the target and recurrent physical page sizes'; the
    fork's #602 gives its groups by layer count), so every block is strided by 12 recurrent
    pages. What vLLM with patch 0002 does instead (it regroups split pages, recurrent
    layers in pairs) is the next test."""
    import vllm.v1.core.kv_cache_planning as planning
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, UniformTypeKVCacheSpecs

    from tests.planner.seed_shapes import vllm_config as planner_config

    config = planner_config(max_model_len=262_144)
    at_2304 = runtime_pages(mtp3_as_served, 2304, None)
    target_page = sum(s.page_size_bytes for n, s in at_2304.items()
                      if n.startswith("model.layers.3.self_attn."))  # fmt: skip
    assert target_page == 1_292_544
    auto = planning.get_kv_cache_groups(config, runtime_pages(mtp3_as_served, 2304, target_page))
    assert sorted(len(g.layer_names) for g in auto) == [11, 11, 12, 24]
    split_specs = runtime_pages(mtp3_as_served, 512, None)
    split = [KVCacheGroupSpec(g.layer_names, UniformTypeKVCacheSpecs.from_specs(
        {n: split_specs[n] for n in g.layer_names})) for g in auto]  # fmt: skip
    for name, groups in (("automatic", auto), ("split", split)):
        kv = planning.get_kv_cache_config_from_groups(config, groups, SEED_004_BUDGET)
        tokens, concurrency = get_kv_cache_capacity(config, kv)
        assert (tokens, round(concurrency, 2)) == SEED_004[name], name
    ratio = SEED_004["automatic"][0] / SEED_004["split"][0]
    assert round(ratio, 2) == 3.49


def test_patch_0002_regroups_the_split_pages(mtp3_as_served, split_512):
    """The term that differs between the kit's image and the qualified runtime: on the same
    caches and budget, vLLM with patch 0002 groups the split pages itself (the recurrent
    layers in pairs, the stride 12 target pages), so the split layout keeps about as many
    tokens as the automatic one instead of seed 004's 3.49 times fewer."""
    from tests.planner.seed_shapes import vllm_config as planner_config

    config = planner_config(max_model_len=262_144)
    kit = plan(config, runtime_pages(mtp3_as_served, 512, None), SEED_004_BUDGET)
    recurrent = [len(g.layer_names) for g in kit.groups
                 if all(n.endswith(".self_attn") for n in g.layer_names)]  # fmt: skip
    assert sum(recurrent) == 34 and max(recurrent) <= 3
    assert kit.stride == 12 * 287_232  # the 24-cache target group is now the widest
    assert kit.tokens > 3 * SEED_004["split"][0]

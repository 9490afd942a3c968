"""The series and the kit's expectations on GLM-5.3's specs as vLLM's own layers build them
(capacity/glm53_specs.py: the indexer cache, the tail ring and the gated-delta state from
vLLM's classes in a 4-rank gloo world; the MLA latent from MLAAttention's spec method with the
SM120 sparse-MLA backend's implementation, whose row in vLLM 0.34.0 is the qualified runtime's
528 bytes)."""

from __future__ import annotations

import pytest
from vllm.utils.math_utils import cdiv, next_power_of_2
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.kv_cache_interface import CircularBufferSpec, MambaSpec, MLAAttentionSpec

from capacity.engine_plan import vllm_lines
from capacity.glm53_specs import INDEX_KPOOL, KV_LAYOUT
from kvgeometry.report import format_geometry
from launch.glm53 import RUNTIME_LATENT_BYTES
from launch.loader import load
from smoke.log_checks import log_checks
from smoke.logparse import parse_lines
from tests.planner.planning import plan
from tests.planner.seed_shapes import TWELVE_GIB, vllm_config

C4_UNIT = 64 * 132
"""Seed 004's packed C4 index-page unit: 64 entries of 128 FP8 bytes and 4 scale bytes."""


def by_kind(specs: dict) -> dict[str, list]:
    kinds: dict[str, list] = {"latent": [], "indexer": [], "tail_ring": [], "recurrent": []}
    for name, spec in specs.items():
        if isinstance(spec, MambaSpec):
            kinds["recurrent"].append(spec)
        elif isinstance(spec, CircularBufferSpec):
            kinds["tail_ring"].append(spec)
        elif isinstance(spec, MLAAttentionSpec) and name.endswith("k_cache"):
            kinds["indexer"].append(spec)
        else:
            kinds["latent"].append(spec)
    return kinds


@pytest.fixture
def split_512(monkeypatch):
    monkeypatch.setenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE", "512")
    monkeypatch.setenv("VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE", "512")


def test_vllm_builds_three_specs_per_sparse_mla_layer(real_specs):
    kinds = by_kind(real_specs["mtp3"])
    assert {k: len(v) for k, v in kinds.items()} == {
        "latent": 11, "indexer": 11, "tail_ring": 11, "recurrent": 34,
    }  # fmt: skip
    indexer = kinds["indexer"][0]
    assert indexer.tokens_per_state == INDEX_KPOOL
    assert indexer.page_size_bytes == 512 // INDEX_KPOOL * indexer.head_size == 16_896
    assert indexer.block_stride_alignment == MultipleOf(256)  # its backend's kernel blocks
    ring = kinds["tail_ring"][0]
    assert ring.block_size == INDEX_KPOOL * next_power_of_2(cdiv(INDEX_KPOOL + 3, INDEX_KPOOL))
    assert not ring.dcp_sharded
    # seed 004: the target page 287,232 = the runtime's latent + this indexer page
    assert 512 * RUNTIME_LATENT_BYTES + indexer.page_size_bytes == 287_232


def test_recurrent_pages_are_the_seeds(real_specs):
    """Seed 004: 'a 1,171,456-byte DFlash recurrent page' and 'the 1,122,304-byte MTP recurrent
    page', both as vLLM's gated-delta layer builds them at TP4 (7 and 3 draft tokens)."""
    assert {s.page_size_bytes for s in by_kind(real_specs["mtp3"])["recurrent"]} == {
        1_122_304
    }
    assert {s.page_size_bytes for s in by_kind(real_specs["dflash"])["recurrent"]} == {
        1_171_456
    }


def test_seed_000_906_blocks_come_from_the_runtimes_latent_rows(real_specs, tmp_path):
    """12 GiB over the widest group's bytes per block: 11 layers x (latent + indexer) at 2,304
    tokens. With the runtime's 528-byte latent rows that is seed 000's 906 blocks. vLLM 0.34.0's
    SM120 backend stores the same rows but aligns the stride to 64 of them: 905. vLLM's general
    DS-MLA row (656 bytes: what 0.33.0 stored, and the FlashMLA sparse backend stores) holds
    fewer still."""
    from capacity.glm53_specs import Shape, build, runtime_latent

    kinds = by_kind(real_specs["dflash"])
    assert kinds["latent"][0].page_size_bytes == 2304 * RUNTIME_LATENT_BYTES
    per_layer = kinds["latent"][0].page_size_bytes + kinds["indexer"][0].page_size_bytes
    runtime = plan(vllm_config(dcp=4), runtime_latent(real_specs["dflash"]))
    assert runtime.stride == 11 * per_layer == 14_217_984
    assert runtime.config.num_blocks == 906
    sm120 = plan(vllm_config(dcp=4), real_specs["dflash"])
    alignment = 64 * RUNTIME_LATENT_BYTES
    assert sm120.stride == -(-runtime.stride // alignment) * alignment
    assert sm120.config.num_blocks == 905
    general = build(Shape(tp=4, dcp=4, spec_tokens=7, block_size=2304,
                          attention_backend="FLASHMLA_SPARSE"), tmp_path)  # fmt: skip
    latent = by_kind(general)["latent"][0]
    assert latent.page_size_bytes == 2304 * 656
    own = plan(vllm_config(dcp=4), general)
    assert own.stride >= 11 * (latent.page_size_bytes + kinds["indexer"][0].page_size_bytes)
    assert own.config.num_blocks == 12_884_901_888 // own.stride < 905


def test_the_c4_unit_already_divides_the_stride(real_specs, split_512):
    """Why 0002 dropped its C4 stride alignment: on the specs vLLM builds, the indexer's kernel
    block sizes already make every stride a whole number of C4 units."""
    split = plan(vllm_config(max_model_len=262_144), real_specs["mtp3"])
    dflash = plan(vllm_config(dcp=4), real_specs["dflash"])
    assert split.stride % C4_UNIT == 0
    assert dflash.stride % C4_UNIT == 0


def report_facts(specs: dict) -> tuple[dict, object]:
    """The geometry plugin's line for a plan of vLLM's planner, read back by the smoke parser."""
    config = vllm_config(max_model_len=262_144)
    result = plan(config, specs)
    line = format_geometry(config, result.config)
    prefix = "(EngineCore pid=1) INFO 12-01 10:00:00 [__init__.py:1] "
    return parse_lines([prefix + line]), result


def test_the_report_describes_every_role_and_the_scheduler(real_specs, split_512):
    facts, result = report_facts(real_specs["mtp3"])
    geometry = facts.kv_geometry
    assert geometry.layout == KV_LAYOUT == "BLHNC"
    assert (geometry.stride_bytes, geometry.num_blocks, geometry.tokens) == (
        result.stride, result.config.num_blocks, result.tokens,
    )  # fmt: skip
    assert geometry.scheduler_block == result.scheduler_block == 512
    assert geometry.hash_block == 512
    kinds = by_kind(real_specs["mtp3"])
    assert geometry.block_sizes == {
        role: specs[0].block_size for role, specs in kinds.items()
    } == {"latent": 512, "indexer": 512, "tail_ring": 8, "recurrent": 512}  # fmt: skip
    pages = {role: specs[0].page_size_bytes for role, specs in kinds.items()}
    assert geometry.page_bytes == pages
    layers = {}
    for g in geometry.groups:
        layers[g.role] = layers.get(g.role, 0) + g.layers
    assert layers == {"latent": 11, "indexer": 11, "tail_ring": 11, "recurrent": 34}


def test_mtp3_expectations_hold_on_vllms_report_and_name_another_latent(
    real_specs, split_512, tmp_path
):
    """The profile's block and page expectations are what a report of vLLM 0.34.0's geometry
    prints (its SM120 latent is the runtime's); a backend with vLLM's general 656-byte row
    fails the page check by name."""
    from capacity.glm53_specs import Shape, build

    profile = load("mtp3-tp4-split").profile
    runtime, _ = report_facts(real_specs["mtp3"])
    checks = {c.key: c for c in log_checks(profile, runtime)}
    assert checks["log.block-sizes"].ok and checks["log.page-bytes"].ok
    general = build(Shape(tp=4, dcp=1, spec_tokens=3, block_size=512,
                          attention_backend="FLASHMLA_SPARSE"), tmp_path)  # fmt: skip
    own, _ = report_facts(general)
    page = {c.key: c for c in log_checks(profile, own)}["log.page-bytes"]
    latent = by_kind(general)["latent"][0].page_size_bytes
    assert not page.ok and f"'latent': {latent}" in page.seen
    assert latent == 512 * 656


def test_grouping_logs_the_runtimes_second_split_line(real_specs, split_512):
    """Patch 0002's grouping line, in the runtime's wording, with the page sizes of the specs
    vLLM builds; the smoke parser reads them back."""
    import vllm.v1.core.kv_cache_planning as planning

    specs = real_specs["mtp3"]
    with vllm_lines("vllm.v1.core.kv_cache_planning") as lines:
        planning.get_kv_cache_groups_from_builder(
            planning.DefaultKVCacheConfigBuilder(), vllm_config(max_model_len=262_144), specs
        )
    pages = sorted({spec.page_size_bytes for spec in specs.values()})
    line = f"Keeping split GLM-5.3 cache groups with physical page sizes {pages}."
    assert lines == [line]
    assert pages == [4096, 16_896, 270_336, 1_122_304]  # as patch 0002's header states
    facts = parse_lines([f"(EngineCore pid=1) INFO 12-01 10:00:00 [kv_cache_planning.py:1] {line}"])
    assert facts.split_pages.physical_page_bytes == pages


@pytest.mark.parametrize("profile", ["mtp3-tp4-split", "dflash-tp4-dcp4"])
def test_the_plugin_reports_each_glm_profile_from_the_engine_cores_call(
    real_specs, monkeypatch, profile
):
    """The geometry plugin registered as vLLM loads it, then the engine core's own planner call
    (`vllm.v1.engine.core.get_kv_cache_configs`) on GLM-5.3's specs (the runtime's latent
    row): one line, read back by the smoke parser, the same plan as without the plugin, and
    the profile's geometry expectations that need no draft (blocks, block sizes, pages) met."""
    import vllm.v1.engine.core as core
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups

    import kvgeometry
    from capacity.glm53_specs import runtime_latent

    if profile == "mtp3-tp4-split":
        monkeypatch.setenv("VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE", "512")
        monkeypatch.setenv("VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE", "512")
        shape, config = "mtp3", vllm_config(max_model_len=262_144)
    else:
        shape, config = "dflash", vllm_config(dcp=4)
    specs = runtime_latent(real_specs[shape])  # the profiles' figures are the runtime's
    want = plan(config, specs)
    monkeypatch.setattr(core, "get_kv_cache_configs", core.get_kv_cache_configs)
    kvgeometry.register()
    with vllm_lines("vllm.kvgeometry") as lines:
        groups = get_global_kv_cache_groups(config, [specs])
        configs = core.get_kv_cache_configs(config, [specs], [TWELVE_GIB], groups)
    assert len(lines) == 1
    facts = parse_lines([f"(EngineCore pid=1) INFO 12-01 10:00:00 [__init__.py:60] {lines[0]}"])
    geometry = facts.kv_geometry
    assert geometry.num_blocks == configs[0].num_blocks == want.config.num_blocks
    assert geometry.stride_bytes == want.stride
    assert geometry.layers == {"latent": 11, "indexer": 11, "tail_ring": 11, "recurrent": 34}
    dcp = config.parallel_config.decode_context_parallel_size
    assert {(g.role, g.cp_size) for g in geometry.groups} == {
        ("latent", dcp), ("indexer", dcp), ("tail_ring", 1), ("recurrent", 1),
    }  # fmt: skip
    # the DFlash draft's specs are not built here (its block size is the draft's own check)
    made = {"mtp3-tp4-split": ("log.block-sizes", "log.page-bytes"),
            "dflash-tp4-dcp4": ("log.kv-blocks",)}[profile]  # fmt: skip
    checks = {c.key: c for c in log_checks(load(profile).profile, facts)}
    assert all(checks[n].ok for n in made), [checks[n] for n in made]

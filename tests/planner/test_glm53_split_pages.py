"""Patch 0002 on the real planner and platform: opt-in split pages, C4 stride only for GLM-5.3."""

from __future__ import annotations

import pytest
from vllm.platforms.interface import Platform, glm53_split_block_sizes

from tests.planner.planning import plan, pristine_planner
from tests.planner.seed_shapes import (
    draft_full,
    mla,
    mtp_split_seed,
    recurrent,
    vllm_config,
)

TARGET = "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE"
MAMBA = "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE"
C4_UNIT = 64 * 132


@pytest.fixture
def split_512(monkeypatch):
    monkeypatch.setenv(TARGET, "512")
    monkeypatch.setenv(MAMBA, "512")


def one_mla_three_recurrent(speculator: str) -> dict:
    """A cache whose widest group is a recurrent page, not a whole number of C4 units."""
    specs = {"model.layers.3.self_attn": mla(512, dcp_sharded=False)}
    for i in range(3):
        specs[f"model.layers.{i}.linear_attn"] = recurrent(512, speculator)
    return specs


def test_seed_004_pages_are_preserved(split_512):
    result = plan(vllm_config(max_model_len=262_144), mtp_split_seed())
    pages = {
        type(spec).__name__: spec.page_size_bytes
        for g in result.groups
        for spec in g.kv_cache_spec.kv_cache_specs.values()
    }
    assert pages == {"MLAAttentionSpec": 287_232, "MambaSpec": 1_122_304}
    assert {g.kv_cache_spec.block_size for g in result.groups} == {512}
    assert 34 * C4_UNIT == 287_232


@pytest.mark.parametrize(("speculator", "page"), [("mtp", 1_122_304), ("dflash", 1_171_456)])
def test_stride_is_aligned_to_the_c4_unit_for_glm53(split_512, speculator, page):
    result = plan(vllm_config(), one_mla_three_recurrent(speculator))
    with pristine_planner():
        before = plan(vllm_config(), one_mla_three_recurrent(speculator))
    assert before.stride == page
    assert result.stride == -(-page // C4_UNIT) * C4_UNIT
    assert result.stride % C4_UNIT == 0


def test_inherited_variable_does_not_touch_another_architecture(split_512):
    config = vllm_config(architecture="DeepseekV32ForCausalLM")
    assert glm53_split_block_sizes(config) is None
    result = plan(config, one_mla_three_recurrent("dflash"))
    assert result.stride == 1_171_456


def test_no_c4_alignment_without_a_glm53_target_mla_spec(split_512):
    specs = {f"model.layers.{i}.linear_attn": recurrent(512, "dflash") for i in range(3)}
    specs["draft.layers.0.self_attn"] = draft_full(512)
    result = plan(vllm_config(), specs)
    with pristine_planner():
        before = plan(vllm_config(), specs)
    assert result.stride == before.stride


def test_unchanged_without_the_variables(monkeypatch):
    monkeypatch.delenv(TARGET, raising=False)
    monkeypatch.delenv(MAMBA, raising=False)
    config = vllm_config()
    assert glm53_split_block_sizes(config) is None
    result = plan(config, one_mla_three_recurrent("dflash"))
    with pristine_planner():
        before = plan(config, one_mla_three_recurrent("dflash"))
    assert [g.kv_cache_spec for g in result.groups] == [g.kv_cache_spec for g in before.groups]
    assert result.stride == before.stride == 1_171_456


@pytest.mark.parametrize(
    ("target", "mamba", "mode", "message"),
    [
        ("0", None, "align", f"{TARGET}='0' must be a positive integer"),
        ("abc", None, "align", f"{TARGET}='abc' must be a positive integer"),
        ("-512", None, "align", f"{TARGET}='-512' must be a positive integer"),
        ("512", "768", "align", f"{MAMBA}=768 must be a positive multiple of {TARGET}=512"),
        ("512", "x", "align", f"{MAMBA}='x' must be a positive integer"),
        (None, "512", "align", f"{MAMBA} is set but {TARGET} is not"),
        ("512", "512", "none", f"{TARGET} requires --mamba-cache-mode align"),
    ],
)
def test_invalid_values_fail_at_start_naming_the_variable(
    monkeypatch, target, mamba, mode, message
):
    for name, value in ((TARGET, target), (MAMBA, mamba)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    config = vllm_config()
    config.cache_config.mamba_cache_mode = mode
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        glm53_split_block_sizes(config)


def test_mamba_block_defaults_to_the_target_block(monkeypatch):
    monkeypatch.setenv(TARGET, "512")
    monkeypatch.delenv(MAMBA, raising=False)
    assert glm53_split_block_sizes(vllm_config()) == (512, 512)
    monkeypatch.setenv(MAMBA, "2048")
    assert glm53_split_block_sizes(vllm_config()) == (512, 2048)


def test_platform_keeps_both_block_sizes_instead_of_promoting(split_512):
    config = vllm_config(max_model_len=262_144)
    config.cache_config.block_size = 256
    Platform._align_hybrid_block_size(config, None)
    assert config.cache_config.block_size == 512
    assert config.cache_config.mamba_block_size == 512
    assert config.cache_config.mamba_page_size_padded is None

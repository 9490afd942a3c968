"""Patch 0002 on vLLM's real platform, planner and environment registry: opt-in split pages,
registered variables, refusals instead of silent replacements, the runtime's own log line.

The page shapes are hand-written (tests/planner/seed_shapes.py says how they differ from what
vLLM builds); the backends are vLLM's own classes.
"""

from __future__ import annotations

import pytest
from vllm.platforms.interface import Platform, glm53_split_block_sizes
from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend

from capacity.engine_plan import vllm_lines
from smoke.log_facts import SplitPageFacts
from smoke.logparse import parse_lines
from tests.planner.planning import plan
from tests.planner.seed_shapes import mla, mtp_split_seed, recurrent, vllm_config

TARGET = "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE"
MAMBA = "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE"


@pytest.fixture
def split_512(monkeypatch):
    monkeypatch.setenv(TARGET, "512")
    monkeypatch.setenv(MAMBA, "512")


def one_mla_three_recurrent() -> dict:
    specs = {"model.layers.3.self_attn": mla(512, dcp_sharded=False)}
    for i in range(3):
        specs[f"model.layers.{i}.linear_attn"] = recurrent(512, "mtp")
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


def test_the_variables_are_registered_so_hard_fail_validation_accepts_them(split_512):
    from vllm import envs

    assert envs.VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE == "512"
    Platform.validate_environ(hard_fail=True)  # raises "Unknown vLLM environment variable"


def test_launch_detects_the_patched_registration():
    """`launch run` on the patched vLLM meets split_pages from envs.py's table, the table
    vllm.envs answers from (so the image with the series applied runs mtp3's split pages)."""
    from pathlib import Path

    import vllm
    from vllm import envs

    from launch.capabilities import requirements
    from launch.loader import load
    from launch.vllm_install import find_vllm

    install = find_vllm(Path(vllm.__file__).parent)
    assert set(install.env_vars) == set(envs.environment_variables)
    split = next(r for r in requirements(load("mtp3-tp4-split").profile) if r.name == "split_pages")
    assert split.met(install)


def test_inherited_variable_does_not_touch_another_architecture(split_512):
    config = vllm_config(architecture="DeepseekV32ForCausalLM")
    assert glm53_split_block_sizes(config) is None


def test_the_planner_is_unchanged_by_the_variables(split_512, monkeypatch):
    with_split = plan(vllm_config(), one_mla_three_recurrent())
    monkeypatch.delenv(TARGET)
    monkeypatch.delenv(MAMBA)
    without = plan(vllm_config(), one_mla_three_recurrent())
    assert [g.kv_cache_spec for g in with_split.groups] == [g.kv_cache_spec for g in without.groups]
    assert with_split.stride == without.stride


def test_a_layer_outer_layout_is_refused_when_the_groups_are_planned(split_512):
    config = vllm_config()
    config.cache_config.kv_cache_layout = "LBNHC"
    with pytest.raises(ValueError, match=f"^{TARGET} needs a block-outermost KV cache layout.*"
                       "this start resolved LBNHC"):  # fmt: skip
        plan(config, one_mla_three_recurrent())


@pytest.mark.parametrize(
    ("target", "mamba", "mode", "message"),
    [
        ("0", None, "align", f"{TARGET}='0' must be a positive integer"),
        ("abc", None, "align", f"{TARGET}='abc' must be a positive integer"),
        ("-512", None, "align", f"{TARGET}='-512' must be a positive integer"),
        ("512", "2048", "align", f"{MAMBA}=2048 differs from {TARGET}=512: the scheduler"),
        ("512", "768", "align", f"{MAMBA}=768 differs from {TARGET}=512"),
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


def test_recurrent_block_defaults_to_the_target_block(monkeypatch):
    monkeypatch.setenv(TARGET, "512")
    monkeypatch.delenv(MAMBA, raising=False)
    assert glm53_split_block_sizes(vllm_config()) == (512, 512)


def align(config) -> list[str]:
    """vLLM's hybrid alignment with vLLM's FlashMLA sparse backend; the lines it logs."""
    with vllm_lines("vllm.platforms.interface") as lines:
        Platform._align_hybrid_block_size(config, FlashMLASparseBackend)
    return lines


def test_platform_keeps_both_blocks_and_logs_the_runtime_line(split_512):
    config = vllm_config(max_model_len=262_144)
    config.cache_config.block_size = 64  # what the backend preference picked before alignment
    lines = align(config)
    assert config.cache_config.block_size == 512
    assert config.cache_config.mamba_block_size == 512
    assert config.cache_config.mamba_page_size_padded is None
    line = ("Using split GLM-5.3 cache pages: target block size 512 tokens, recurrent-state "
            "block size 512 tokens.")  # fmt: skip
    assert lines == [line]
    facts = parse_lines([f"(EngineCore pid=1) INFO 12-01 10:00:00 [interface.py:1] {line}"])
    assert facts.split_pages == SplitPageFacts(512, 512, None)


def test_a_different_user_block_size_is_refused_not_replaced(split_512):
    config = vllm_config()
    config.cache_config.block_size = 1024
    config.cache_config.user_specified_block_size = True
    with pytest.raises(ValueError, match=f"^--block-size 1024 conflicts with {TARGET}=512"):
        align(config)
    assert config.cache_config.block_size == 1024
    config.cache_config.block_size = 512
    align(config)
    assert config.cache_config.block_size == 512


def test_a_target_block_off_the_mla_alignment_is_refused(monkeypatch):
    monkeypatch.setenv(TARGET, "320")  # a multiple of FlashMLA's 64, not of MLA's 128
    monkeypatch.delenv(MAMBA, raising=False)
    with pytest.raises(ValueError, match=f"^{TARGET}=320 must be a multiple of 128 tokens .*"
                       r"128 tokens for MLA decode kernels\); e\.g\. 384\."):  # fmt: skip
        align(vllm_config())



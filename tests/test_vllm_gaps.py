"""Where upstream vLLM differs from the runtime the seeds qualified, as the launcher reads it in
the installed source: vLLM 0.34.0 (the kit's base) and 0.33.0 (its previous base, read from its
own wheel, which `make test` downloads into .venv/wheels).

The draft: vLLM 0.33.0 keeps a draft's cache replicated only when the speculator's DCP size is 1,
and the speculator takes the target's DCP size; a DFlash draft's sliding-window layers then stop
the start at vLLM's own assertion after the weights load, so `launch run dflash-tp4-dcp4`
refuses on it before anything starts, whatever FALLBACKS says. vLLM 0.34.0 gives the speculator
the draft's own DCP size, which DFlash defaults to 1 for a windowed draft: the draft stays
replicated and the profile runs there unqualified, with only the fork's knobs as fallbacks.
The target's attention backend: without the fork's B12X backend, vLLM picks its SM120 sparse-MLA
backend, whose latent row is the qualified runtime's 528 bytes in 0.34.0 (pages and capacity
still checked) and vLLM's general 656-byte format in 0.33.0 (those checks dropped).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import zipfile
from unittest import mock

import pytest

from capacity.glm53_specs import text_config
from launch.capabilities import requirements, resolve
from launch.deviations import NotChecked
from launch.errors import UsageError
from launch.glm53 import MLA_SHAPE, RUNTIME_LATENT_BYTES
from launch.loader import load
from launch.overrides import from_environment
from launch.plan import assemble, plan_for
from launch.settings import read_settings
from launch.vllm_install import VllmInstall, find_vllm
from launch.vllm_vocab import VLLM_VERSION
from tests.conftest import REPO

PREVIOUS = "0.33.0"
sys.path.insert(0, str(REPO / "docker"))
from selfcheck import LAUNCH_FALLBACKS  # noqa: E402  (docker/ is not a package)

DFLASH_FORK_KNOBS = LAUNCH_FALLBACKS["dflash-tp4-dcp4"]
"""What dflash-tp4-dcp4 uses that only the fork has (seed 000: B12X target kernels,
B12X_PCIE_ALLREDUCE=1, DCP_CKV_GATHER=1, the KDA decode selector in additional_config): what the
image's self-check expects `launch run` to name."""


@pytest.fixture(scope="module")
def pristine() -> VllmInstall:
    install = find_vllm()
    assert install is not None and install.version == VLLM_VERSION
    return install


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> VllmInstall:
    """vLLM 0.33.0's Python source, from its PyPI wheel."""
    wheel = next((REPO / ".venv" / "wheels").glob(f"vllm-{PREVIOUS}-*.whl"), None)
    assert wheel is not None, f"make test downloads vllm {PREVIOUS}'s wheel into .venv/wheels"
    root = tmp_path_factory.mktemp("vllm-previous")
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(root, [n for n in whl.namelist()
                              if n.startswith("vllm/") and n.endswith(".py")])  # fmt: skip
    return VllmInstall(root / "vllm", PREVIOUS)


def every_fallback(name: str) -> str:
    return ",".join(r.name for r in requirements(load(name).profile))


def test_glm53_mla_shape_is_the_configs():
    text = text_config()
    assert (text.kv_lora_rank, text.qk_rope_head_dim) == MLA_SHAPE


def test_vllm_0_33_shards_the_draft_and_stops_on_a_sliding_window(previous):
    """What the refusal quotes is in 0.33.0's source."""
    assert "DCP not support sliding window." in (
        previous.root / "v1/kv_cache_interface.py"
    ).read_text(encoding="utf-8")
    assert previous.draft_replication_problem is not None


def test_launch_run_refuses_on_0_33_whatever_fallbacks_say(previous):
    env = {**os.environ, "FALLBACKS": every_fallback("dflash-tp4-dcp4")}
    env.pop("DCP", None)
    done = subprocess.run(
        [sys.executable, "-m", "launch", "run", "dflash-tp4-dcp4", "--vllm-root",
         str(previous.root), "--dry-run"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: engine.speculative_config.method='dflash': the installed vLLM cannot keep the "
        f"draft replicated under DCP 4 (vLLM {PREVIOUS} at "
    )
    assert "'DCP not support sliding window.'" in done.stderr
    assert "FALLBACKS cannot waive it" in done.stderr
    assert "vllm serve" not in done.stdout + done.stderr


def test_vllm_0_34_keeps_the_dflash_draft_replicated(pristine):
    """0.34.0's source: the speculator takes the draft's DCP size, DFlash's default is 1 for a
    windowed draft, and the runner then builds the draft's specs `dcp_sharded=False`."""
    assert pristine.draft_replication_problem is None
    dflash = (pristine.root / "v1/worker/gpu/spec_decode/dflash/config.py").read_text()
    assert "def default_draft_decode_context_parallel_size" in dflash


def test_dflash_plans_on_0_34_with_only_the_forks_knobs_as_fallbacks(pristine):
    """Without FALLBACKS the refusal names exactly the fork's knobs; with them the profile
    plans, unqualified, and keeps its page-geometry expectations."""
    with pytest.raises(UsageError) as refused:
        resolve(load("dflash-tp4-dcp4").profile, pristine)
    assert "cannot keep the draft replicated" not in str(refused.value)
    named = re.search(r"FALLBACKS=(\S+) \(", str(refused.value))
    assert named is not None and sorted(named[1].split(",")) == sorted(DFLASH_FORK_KNOBS)
    loaded = load("dflash-tp4-dcp4", from_environment({"FALLBACKS": named[1]}))
    plan = assemble(loaded, resolve(loaded.profile, pristine))
    fallbacks = resolve(loaded.profile, pristine).fallbacks
    assert sorted(r.name for r in fallbacks) == sorted(DFLASH_FORK_KNOBS)
    # the runtime's capacity figures do not hold on vLLM's SM120 backend (its 64-row stride
    # alignment: 905 blocks, tests/planner/test_capacity_seeds.py); the draft's block does
    assert plan.profile.expect.kv_blocks is None
    assert plan.profile.expect.kv_cache_tokens is None
    assert plan.profile.expect.block_sizes == {"draft": 2304}


def test_without_dcp_the_draft_needs_no_replication(previous):
    sets = {"DCP": "1", "CP_KV_CACHE_INTERLEAVE_SIZE": "1",
            "FALLBACKS": every_fallback("dflash-tp4-dcp4")}  # fmt: skip
    loaded = load("dflash-tp4-dcp4", from_environment(sets))
    assert resolve(loaded.profile, previous).profile.engine.decode_context_parallel_size == 1


def backend_fallback_plan(install: VllmInstall):
    """mtp3-tp4-split on `install` with only the attention backends falling back (pristine vLLM
    also lacks split pages, whose own fallback drops page checks too)."""
    fallbacks = {"FALLBACKS": every_fallback("mtp3-tp4-split")}
    loaded = load("mtp3-tp4-split", from_environment(fallbacks))
    resolution = resolve(loaded.profile, install)
    only_backends = dataclasses.replace(resolution, fallbacks=tuple(
        r for r in resolution.fallbacks if r.name.endswith("attention_backend")))  # fmt: skip
    return assemble(loaded, only_backends)


def test_the_sm120_latent_of_0_34_keeps_the_page_checks(pristine):
    """vLLM 0.34.0's SM120 sparse-MLA backend stores GLM-5.3's latent in the runtime's 528-byte
    row, so the profile's 270,336-byte latent page still holds; the capacity figures are the
    runtime's (its stride has no 64-row alignment) and are dropped."""
    assert pristine.sm120_sparse_mla_row_bytes(*MLA_SHAPE) == RUNTIME_LATENT_BYTES
    plan = backend_fallback_plan(pristine)
    assert plan.profile.expect.page_bytes["latent"] == 512 * RUNTIME_LATENT_BYTES
    assert NotChecked("page_bytes", "fallback attention_backend") not in plan.deviations
    assert plan.profile.expect.kv_cache_tokens_min is None
    assert {d.key for d in plan.deviations if isinstance(d, NotChecked)} >= {
        "backends", "kv_cache_tokens_min", "max_concurrency_min"}


def test_the_latent_of_0_33_drops_page_and_capacity_checks(previous):
    """vLLM 0.33.0 stores FP8 latents in its general DS-MLA format (656 bytes per token), so seed
    004's 287,232-byte page cannot hold there."""
    assert previous.sm120_sparse_mla_row_bytes(*MLA_SHAPE) is None
    plan = backend_fallback_plan(previous)
    assert plan.profile.expect.page_bytes is None
    assert plan.profile.expect.kv_cache_tokens_min is None
    for field in ("page_bytes", "kv_cache_tokens_min", "max_concurrency_min"):
        assert NotChecked(field, "fallback attention_backend") in plan.deviations


def test_the_row_read_from_the_source_is_the_backends_own():
    """The row the launcher reads from the source is what the backend class returns."""
    from types import SimpleNamespace

    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse_sm120 import (
        FlashInferMLASparseSM120Impl,
    )

    rank, rope = MLA_SHAPE
    impl = SimpleNamespace(kv_lora_rank=rank, qk_rope_head_dim=rope)
    assert FlashInferMLASparseSM120Impl.get_fp8_ds_mla_row_bytes(impl) == RUNTIME_LATENT_BYTES


def test_capacity_keeps_the_draft_replicated_as_vllms_dflash_config_says(previous, monkeypatch):
    """`make capacity` asks vLLM's DFlash speculator config whether the draft stays replicated
    under DCP: vLLM 0.34.0's says so; 0.33.0 has no such config (its wheel lacks the module), and
    without it the answer is the refusal, naming vLLM's assertion."""
    import capacity.engine as engine

    assert engine.draft_replicated(4)
    assert not (previous.root / "v1/worker/gpu/spec_decode/dflash/config.py").exists()
    with mock.patch.dict(sys.modules, {"vllm.v1.worker.gpu.spec_decode.dflash.config": None}):
        assert not engine.draft_replicated(4)
    monkeypatch.setattr(engine, "draft_replicated", lambda dcp: False)
    argv = plan_for(read_settings(("IMAGE_SOURCE=kit",)), "dflash-tp4-dcp4").argv
    with pytest.raises(engine.Unsupported, match=re.escape("'DCP not support sliding window.'")):
        engine.glm53_specs(argv, {}, "cuda")


def test_capacity_builds_no_draft_it_does_not_know():
    from capacity.engine import Unsupported, glm53_specs

    argv = plan_for(read_settings(("IMAGE_SOURCE=kit",)), "dflash-tp4-dcp4").argv
    other = tuple(a.replace("GLM-5.3-Flash-DFlash2-MXFP8", "Other-DFlash") for a in argv)
    with pytest.raises(Unsupported, match="the DFlash draft local-inference-lab/Other-DFlash"):
        glm53_specs(other, {}, "cuda")

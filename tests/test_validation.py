"""Bad input fails closed: exit 2, one message naming field, value and fix, nothing started.

Each case runs the real `python -m launch run` with a stand-in `vllm` executable on PATH that
records that it was started; a rejected profile must leave no record.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.compose_env import ENV_FILE_VAR
from launch.image_lock import LOCK_VAR
from launch.settings import SECRET_FILE_VARS
from launch.vllm_vocab import VLLM_VERSION
from tests.conftest import REPO

BAD_INPUTS = [
    # (profile, environment, --set values, text the message must contain)
    ("cpu-tiny", {"GPU_DEVICES": "0"}, [], "lists GPUs for a CPU profile"),
    ("cpu-tiny", {"VLLM_EXTRA_ARGS": "--max-num-seqs 4"}, [], "set engine.max_num_seqs instead"),
    ("mtp3", {}, [], "is not a shipped profile. Fix: did you mean 'mtp3-tp4-split'?"),
    ("dflash-tp4-dcp4", {}, ["MAX_NUM_SEQ=16"], "Fix: did you mean 'MAX_NUM_SEQS'?"),
    ("dflash-tp4-dcp4", {"MAX_MODEL_LEN": "1.5K"}, [], "is not a count vLLM reads. "
     "Fix: give a whole number: 262144, 256K (x 1024) or 262k (x 1000)"),
    ("cpu-tiny", {"KV_CACHE_MEMORY": "12 XB"}, [], "KV_CACHE_MEMORY (engine.kv_cache_memory_bytes)"
     "='12 XB': is not a size. Fix: e.g. KV_CACHE_MEMORY=12GiB"),
    ("cpu-tiny", {"MODEL_REVISION": "a" * 40}, [], "has no meaning for a model directory"),
    ("cpu-tiny", {}, ["deployment.device=tpu"], "deployment.device='tpu': is not a device"),
    ("dflash-tp4-dcp4", {"DCP": "3"}, [], "engine.decode_context_parallel_size=3"),
    ("dflash-tp4-dcp4", {"TP": "0"}, [], "engine.tensor_parallel_size=0"),
    ("dflash-tp4-dcp4", {"TP": "four"}, [], "must be an integer"),
    ("dflash-tp4-dcp4", {"DCP": "-4"}, [], "engine.decode_context_parallel_size=-4"),
    ("dflash-tp4-dcp4", {"GPU_DEVICES": "0,1,2"}, [], "has 3 GPUs but TP x PP = 4"),
    ("dflash-tp4-dcp4", {"GPU_DEVICES": "0,1,1,2"}, [], "lists a GPU twice"),
    (
        "dflash-tp4-dcp4",
        {"CP_KV_CACHE_INTERLEAVE_SIZE": "0"},
        [],
        "engine.cp_kv_cache_interleave_size=0",
    ),
    ("mtp3-tp4-split", {"CP_KV_CACHE_INTERLEAVE_SIZE": "4"}, [], "without context parallelism"),
    (
        "dflash-tp4-dcp4",
        {"NUM_SPECULATIVE_TOKENS": "0"},
        [],
        "engine.speculative_config.num_speculative_tokens=0",
    ),
    ("dflash-tp4-dcp4", {"NUM_SPECULATIVE_TOKENS": "9000"}, [], "more than max_num_batched_tokens"),
    (
        "mtp3-tp4-split",
        {"VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE": "2048"},
        [],
        "must equal the target block (512): the scheduler's align-mode split",
    ),
    (
        "mtp3-tp4-split",
        {"VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE": "-512"},
        [],
        "features.split_pages.target_block_size=-512",
    ),
    (
        "mtp3-tp4-split",
        {},
        ["engine.mamba_cache_mode=none"],
        "split pages require mamba_cache_mode=align",
    ),
    (
        "dflash-tp4-dcp4",
        {"GPU_MEMORY_UTILIZATION": "0.9"},
        [],
        "cannot be combined with kv_cache_memory_bytes",
    ),
    (
        "dflash-tp4-dcp4",
        {"MAX_CUDAGRAPH_CAPTURE_SIZE": "512"},
        [],
        "exceeds the largest decode batch",
    ),
    ("dflash-tp4-dcp4", {"MODEL_REVISION": "main"}, [], "must be a full 40-hex commit"),
    (
        "dflash-tp4-dcp4",
        {"DFLASH_MODEL_REVISION": "b6d33aa"},
        [],
        "engine.speculative_config.revision='b6d33aa'",
    ),
    ("dflash-tp4-dcp4", {"PORT": "70000"}, [], "deployment.port=70000"),
    ("dflash-tp4-dcp4", {}, ["engine.max_num_seq=16"], "is not a settable profile path"),
    ("dflash-tp4-dcp4", {}, ["MAX_NUM_SEQS"], "must be key=value"),
    ("dflash-tp4-dcp4", {"CUDAGRAPH_MODE": "FULLL"}, [], "is not a vLLM CUDA graph mode"),
    ("dflash-tp4-dcp4", {"KV_CACHE_DTYPE": "fp9"}, [], "is not a vLLM KV cache dtype"),
    ("dflash-tp4-dcp4", {"SPECULATOR": "eagle3"}, [], "is not a speculative method"),
    ("dflash-tp4-dcp4", {"B12X_PCIE_ALLREDUCE": "maybe"}, [], "must be true or false"),
    ("dflash-tp4-dcp4", {"FALLBACKS": "split_pages"}, [], "is not a fallback of this profile"),
    ("no-such-profile", {}, [], "is not a shipped profile"),
    ("dflash-tp4-dcp4", {"MAX_MODEL_LEN": "0"}, [], "engine.max_model_len=0"),
]


UPSTREAM_FALLBACKS = (
    "b12x_pcie_allreduce",
    "dcp_ckv_gather",
    "attention_backend",
    "glm53_kda_decode_backend",
)
"""dflash-tp4-dcp4's fork knobs in the order `launch run` names them."""


def run_launch(
    tmp_path: Path, args: list[str], environ: dict[str, str]
) -> subprocess.CompletedProcess:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "vllm"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "open(os.environ['KIT_TEST_MARKER'], 'w').write(json.dumps("
        "{'argv': sys.argv[1:], 'env': {k: os.environ.get(k) for k in "
        "('CUDA_VISIBLE_DEVICES', 'VLLM_ENABLE_PCIE_ALLREDUCE', 'VLLM_B12X_MLA_CKV_GATHER')}}))\n"
    )
    fake.chmod(0o755)
    env = {
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "KIT_TEST_MARKER": str(tmp_path / "started"),
        # the test's own settings file, lock and secret files (conftest), never the checkout's
        # compose/.env or compose/secrets
        **{k: os.environ[k] for k in (ENV_FILE_VAR, LOCK_VAR, *SECRET_FILE_VARS)},
        **environ,
    }
    return subprocess.run(
        [sys.executable, "-m", "launch", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("profile", "environ", "sets", "needle"), BAD_INPUTS)
def test_bad_input_exits_2_with_one_message_and_starts_nothing(
    tmp_path, fork_vllm_tree, profile, environ, sets, needle
):
    args = ["run", profile, "--vllm-root", str(fork_vllm_tree)]
    for item in sets:
        args += ["--set", item]
    result = run_launch(tmp_path, args, environ)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert needle in errors[0]
    assert "Fix: " in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "started").exists()


HOSTILE_VALUES = ("", "-1", "0", "\u0661\u0662", "1e999", "nan", "9" * 30, "x" * 10_000,
                  "\x00\x07", '"', "4,\u00a05", "12GiB")  # fmt: skip
"""Huge, negative, zero, non-ASCII digits, non-finite, a 10 kB string, control characters, an
unbalanced quote, a no-break space, a unit vLLM does not read."""


@pytest.mark.parametrize("profile", ["cpu-tiny", "mtp3-tp4-split", "dflash-tp4-dcp4"])
def test_every_override_with_hostile_values_plans_or_is_refused_never_crashes(profile):
    """Every variable a user may set, with each hostile value: a plan, or the kit's one error
    with a bounded message (this replaced a test that counted this file's own table; it fails on
    the crashes of issue 28: inf/nan, the overflow of a long `k` size, shlex's ValueError, the
    range(TP) hint)."""
    from launch.errors import UsageError
    from launch.overrides import ENV_OVERRIDES
    from tests.conftest import plan_of

    crashed = []
    for name in ENV_OVERRIDES:
        for value in HOSTILE_VALUES:
            try:
                plan_of(profile, {name: value})
            except UsageError as err:
                assert len(str(err)) < 2_000, (name, value[:20], len(str(err)))
            except Exception as err:
                crashed.append(f"{name}={value[:20]!r}: {type(err).__name__}: {err}"[:200])
    assert crashed == []


def test_missing_capability_refuses_unless_fallback_named(tmp_path):
    """The installed upstream vLLM lacks the fork's knobs: refuse, then run unqualified (at DCP 1,
    as a user may; vLLM 0.34.0 keeps the draft replicated under DCP as well, and 0.33.0's
    refusal of that is tests/test_vllm_gaps.py's)."""
    from launch.vllm_install import find_vllm

    install = find_vllm()
    assert install is not None and install.version == VLLM_VERSION
    upstream = install.root
    dcp1 = {"DCP": "1", "CP_KV_CACHE_INTERLEAVE_SIZE": "1"}
    refused = run_launch(tmp_path, ["run", "dflash-tp4-dcp4", "--vllm-root", str(upstream)], dcp1)
    assert refused.returncode == 2
    # every missing capability in one message, fallbacks named as the knobs' own fields
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert errors[0].startswith("error: capabilities='4 missing': the installed vLLM lacks ")
    for knob in ("features.b12x_pcie_allreduce=true", "features.dcp_ckv_gather=true",
                 "engine.attention_backend=B12X_MLA_SPARSE",
                 "engine.additional_config.glm53_kda_decode_backend"):  # fmt: skip
        assert knob in errors[0]
    assert f"FALLBACKS={','.join(UPSTREAM_FALLBACKS)} (" in errors[0]
    assert not (tmp_path / "started").exists()
    one_left = run_launch(tmp_path, ["run", "dflash-tp4-dcp4", "--vllm-root", str(upstream)],
                          {**dcp1, "FALLBACKS": "b12x_pcie_allreduce,dcp_ckv_gather,"
                                              "attention_backend"})  # fmt: skip
    assert one_left.returncode == 2
    assert "error: engine.additional_config.glm53_kda_decode_backend='\"auto\"'" in (
        one_left.stderr
    )

    allowed = run_launch(
        tmp_path,
        ["run", "dflash-tp4-dcp4", "--vllm-root", str(upstream)],
        {**dcp1, "FALLBACKS": ",".join(UPSTREAM_FALLBACKS)},
    )
    assert allowed.returncode == 0, allowed.stderr
    assert "UNQUALIFIED: features.b12x_pcie_allreduce=true dropped" in allowed.stderr
    import json

    started = json.loads((tmp_path / "started").read_text())
    assert "--additional-config" not in started["argv"]
    assert started["env"]["VLLM_ENABLE_PCIE_ALLREDUCE"] is None


def test_extra_args_vllm_refuses_stop_launch_run_before_anything_starts(tmp_path):
    import json

    from launch.vllm_install import find_vllm

    root = str(find_vllm().root)
    cpu = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    bad = run_launch(tmp_path, ["run", "cpu-tiny", "--vllm-root", root],
                     {**cpu, "VLLM_EXTRA_ARGS": "--seed 7 --no-such-flag"})  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert "error: engine.extra_args='--seed 7 --no-such-flag': vLLM's own parser refuses it" in (
        bad.stderr
    )
    assert not (tmp_path / "started").exists()
    good = run_launch(tmp_path, ["run", "cpu-tiny", "--vllm-root", root],
                      {**cpu, "VLLM_EXTRA_ARGS": "--seed 7"})  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert json.loads((tmp_path / "started").read_text())["argv"][-8:-6] == ["--seed", "7"]
    assert "engine.extra_args: unset -> --seed,7 (from environment VLLM_EXTRA_ARGS)" in (
        good.stderr
    )


DFLASH_ARGV = [
    "serve", "local-inference-lab/GLM-5.3-Flash-NVFP4",
    "--revision", "520de24eabf507659eaef7c70f14fd584527facc",
    "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1",
    "--decode-context-parallel-size", "4", "--cp-kv-cache-interleave-size", "4",
    "--max-model-len", "1048576", "--max-num-seqs", "32", "--max-num-batched-tokens", "8192",
    "--kv-cache-memory-bytes", "12884901888", "--attention-backend", "B12X_MLA_SPARSE",
    "--served-model-name", "GLM-5.3-Flash",
    "--enable-prefix-caching", "--reasoning-parser", "glm45", "--tool-call-parser", "glm47",
    "--enable-auto-tool-choice",
    "--compilation-config", '{"cudagraph_mode":"FULL","max_cudagraph_capture_size":128}',
    "--speculative-config",
    '{"method":"dflash","num_speculative_tokens":7,'
    '"model":"local-inference-lab/GLM-5.3-Flash-DFlash2-MXFP8",'
    '"revision":"b6d33aa93fc1ac5b23a88251a1c0ce0bfe2ad17c","attention_backend":"FLASH_ATTN",'
    '"kv_cache_dtype":"auto"}',
    "--additional-config", '{"glm53_kda_decode_backend":"auto"}',
    "--host", "0.0.0.0", "--port", "8000",
    "--shutdown-timeout", "60",  # deployment.drain_s: requests in flight finish on a stop
]  # fmt: skip
"""`vllm serve` of dflash-tp4-dcp4 written out by hand from launch/profiles/dflash-tp4-dcp4.yaml
(and the flag names of vLLM 0.34.0's EngineArgs): the launcher's own rendering is what is
tested, so it is not what the test expects (a test that compared the launcher with its own
`build_plan` could not catch a wrong flag or a dropped setting)."""


def test_run_execs_vllm_with_the_rendered_argv_and_environment(tmp_path, fork_vllm_tree):
    import json

    result = run_launch(
        tmp_path,
        ["run", "--vllm-root", str(fork_vllm_tree)],
        {"PROFILE": "dflash-tp4-dcp4", "GPU_DEVICES": "4,5,6,7"},
    )
    assert result.returncode == 0, result.stderr
    started = json.loads((tmp_path / "started").read_text())
    assert started["argv"] == DFLASH_ARGV
    assert started["env"] == {
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "VLLM_ENABLE_PCIE_ALLREDUCE": "1",
        "VLLM_B12X_MLA_CKV_GATHER": "1",
    }


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path, fork_vllm_tree):
    result = run_launch(
        tmp_path, ["run", "mtp3-tp4-split", "--dry-run", "--vllm-root", str(fork_vllm_tree)], {}
    )
    assert result.returncode == 0
    assert "vllm serve local-inference-lab/GLM-5.3-Flash-NVFP4" in result.stderr
    assert not (tmp_path / "started").exists()

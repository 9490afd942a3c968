"""The shipped profiles carry the seeds' values and render to the exact vLLM command."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

from launch.capabilities import resolve
from launch.deviations import Changed, NotChecked
from launch.loader import load, profile_names
from launch.overrides import ENV_OVERRIDES, from_environment, settable_paths
from launch.plan import assemble
from launch.vllm_install import find_vllm
from launch.vllm_vocab import VLLM_VERSION
from tests.conftest import plan_of

REPO = Path(__file__).resolve().parents[1]


def plan(name: str, environ: dict[str, str] | None = None, sets: tuple[str, ...] = ()):
    return plan_of(name, environ, sets)


def flag_value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_two_qualified_profiles_and_the_cpu_lane_ship():
    assert profile_names() == ["cpu-tiny", "dflash-tp4-dcp4", "mtp3-tp4-split"]


def test_cpu_profile_renders_without_gpus_and_states_its_own_capacity():
    p = plan("cpu-tiny")
    assert p.argv[:3] == ("vllm", "serve", "/opt/models/kit-tiny-chat")
    assert flag_value(p.argv, "--dtype") == "float32"
    assert flag_value(p.argv, "--kv-cache-memory-bytes") == "1073741824"
    assert "--enforce-eager" in p.argv and "--revision" not in p.argv
    assert p.env == {}  # no CUDA_VISIBLE_DEVICES for vLLM's CPU build
    e = p.profile.expect
    assert (e.kv_cache_tokens, e.max_concurrency_min, e.max_concurrency_tokens) == (
        131072, 16.0, 8192
    )
    # the arithmetic the profile cites: 1 GiB / (8 layers x K,V x 4 heads x 32 dims x 4 bytes),
    # the layer count the model builder serves
    builder = runpy.run_path(str(REPO / "docker" / "tiny_model.py"))
    assert e.kv_cache_tokens == 1073741824 // (builder["SERVED_LAYERS"] * 2 * 4 * 32 * 4)
    assert e.max_concurrency_min == e.kv_cache_tokens / p.profile.engine.max_model_len


def test_served_model_name_override_keeps_every_capacity_expectation():
    p = plan("mtp3-tp4-split", {"SERVED_MODEL_NAME": "glm"})
    assert p.profile.expect.kv_cache_tokens_min == 1265215
    assert p.profile.expect.max_concurrency_min == 4.83
    assert not [d for d in p.deviations if isinstance(d, NotChecked)]


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
        # seed 000's B12X_PCIE_ALLREDUCE=1 and DCP_CKV_GATHER=1, as the fork's vLLM reads them
        "VLLM_ENABLE_PCIE_ALLREDUCE": "1",
        "VLLM_PCIE_ALLREDUCE_BACKEND": "b12x",
        "VLLM_B12X_MLA_CKV_GATHER": "1",
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


SEEDS = {path.name[:3]: " ".join(path.read_text(encoding="utf-8").split())
         for path in (REPO / "tests" / "fixtures" / "seeds").glob("*.txt")}  # fmt: skip
"""The two documents the profiles were qualified from (../shared/seeds, copied unchanged)."""
QUOTE = re.compile(r"seed (\d{3}): '([^']+)'")


def spellings(value) -> list[str]:
    """How a value may be written in a citation: 1265215 as 1,265,215 too; (4, 4, 1) as (4,4,1)."""
    if isinstance(value, bool | str):
        return [str(value)]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return [str(value), f"{value:,}"]
    return [str(value)]


def leaves(value) -> list:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in leaves(v)]
    if isinstance(value, tuple | list) and not all(isinstance(v, int) for v in value):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


@pytest.mark.parametrize("name", profile_names())
def test_each_expectation_is_in_its_cited_text(name):
    """Every expected number appears in its citation, and every quote of a seed is in that seed:
    a wrong number, or a citation the seed does not say, fails here instead of being pinned."""
    profile = load(name).profile
    exp = profile.expect
    assert set(exp.sources) == set(exp.set_fields())
    for field_name in exp.set_fields():
        source, value = exp.sources[field_name], getattr(exp, field_name)
        for seed, quote in QUOTE.findall(source):
            assert " ".join(quote.split()) in SEEDS[seed], f"{name} {field_name}: {quote!r}"
        if source.startswith(("engine.", "deployment.")):  # the value of another setting
            target = profile
            for part in source.split("."):
                target = getattr(target, part)
            assert target == value, f"{name} {field_name}: {source} is {target}, not {value}"
            continue
        for leaf in leaves(value):
            if isinstance(leaf, tuple):
                written = [str(leaf).replace(" ", ""), str(leaf)]
            else:
                written = spellings(leaf)
            assert any(w in source for w in written), f"{name} {field_name}: {leaf}, {source!r}"


def test_a_wrong_number_or_a_misquote_is_caught():
    """The check above is not vacuous: a changed number or quote fails it."""
    exp = load("mtp3-tp4-split").profile.expect
    source = exp.sources["kv_cache_tokens_min"]
    assert not any(w in source for w in spellings(1_265_216))
    quote = QUOTE.findall(source.replace("retained", "kept"))[0][1]
    assert quote not in SEEDS["004"]


def test_gpu_devices_override_is_shown_reaches_the_environment_and_stays_qualified():
    p = plan("dflash-tp4-dcp4", {"GPU_DEVICES": "4,5,6,7"})
    assert p.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert [str(c) for c in p.placement] == [
        "deployment.gpu_devices: 0,1,2,3 -> 4,5,6,7 (from environment GPU_DEVICES)",
    ]
    assert p.deviations == () and p.qualified
    # Where the GPUs are does not change what the server computes: every expectation stays.
    assert p.profile.expect == load("dflash-tp4-dcp4").profile.expect


def test_compose_placement_keeps_a_start_qualified_but_the_image_source_does_not():
    compose = plan("mtp3-tp4-split", {"GPUS_FROM_RUNTIME": "1", "PORT": "9000"})
    assert compose.qualified and len(compose.placement) == 2
    swapped = plan("mtp3-tp4-split", {"IMAGE_SOURCE": "kit"})
    assert not swapped.qualified
    assert swapped.deviations == (
        Changed("deployment.image", "qualified-split", "kit", "environment IMAGE_SOURCE"),
    )
    assert str(swapped.deviations[0]) == (
        "deployment.image: qualified-split -> kit (from environment IMAGE_SOURCE)")


def test_engine_override_drops_the_capacity_expectations_it_invalidates():
    p = plan("dflash-tp4-dcp4", sets=("KV_CACHE_MEMORY=none", "GPU_MEMORY_UTILIZATION=0.95"))
    assert "--kv-cache-memory-bytes" not in p.argv
    assert flag_value(p.argv, "--gpu-memory-utilization") == "0.95"
    assert p.profile.expect.kv_cache_tokens is None and p.profile.expect.kv_blocks is None
    assert p.profile.expect.block_sizes == {"draft": 2304}
    assert NotChecked(
        "kv_cache_tokens",
        "engine.kv_cache_memory_bytes, engine.gpu_memory_utilization overridden",
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
        assert assemble(loaded, res).checked_against == f"vLLM {VLLM_VERSION} at {fork_vllm_tree}"


@pytest.mark.parametrize("name", ["dflash-tp4-dcp4", "mtp3-tp4-split"])
def test_plan_text_is_copyable_shell(name):
    import shlex

    from launch.plan import format_plan

    p = plan(name)
    text = format_plan(p)
    command = [line for line in text.splitlines() if not line.startswith("#")]
    words = shlex.split(" ".join(line.rstrip("\\") for line in command))
    assert words[0] == "env"
    assert words[1 : 1 + len(p.env)] == [f"{k}={v}" for k, v in p.env.items()]
    assert tuple(words[1 + len(p.env) :]) == p.argv


def test_a_concurrency_floor_must_name_the_length_vllm_reports_it_for():
    from launch.errors import UsageError
    from launch.loader import read_raw
    from launch.profile import Profile
    from launch.schema import build
    from launch.validate import validate

    raw = read_raw("mtp3-tp4-split")
    raw["expect"]["max_concurrency_tokens"] = 202752
    with pytest.raises(UsageError, match=r"differs from engine.max_model_len \(262144\)"):
        validate(build(Profile, raw, ""))
    del raw["expect"]["max_concurrency_tokens"]
    with pytest.raises(UsageError, match="without the request length it is for"):
        validate(build(Profile, raw, ""))


def test_max_model_len_override_drops_the_concurrency_floor_with_its_length():
    p = plan("mtp3-tp4-split", {"MAX_MODEL_LEN": "131072"})
    assert p.profile.expect.max_concurrency_min is None
    assert p.profile.expect.max_concurrency_tokens is None


def test_compose_env_then_environment_then_set_each_named_in_the_plan():
    p = plan_of("dflash-tp4-dcp4", {"MAX_NUM_SEQS": "20"}, ("MAX_NUM_SEQS=24",),
                env_file={"MAX_NUM_SEQS": "16"})  # fmt: skip
    assert flag_value(p.argv, "--max-num-seqs") == "24"
    assert [str(d) for d in p.deviations
            if isinstance(d, Changed) and d.path == "engine.max_num_seqs"] == [
        "engine.max_num_seqs: 32 -> 16 (from compose/.env MAX_NUM_SEQS)",
        "engine.max_num_seqs: 16 -> 20 (from environment MAX_NUM_SEQS)",
        "engine.max_num_seqs: 20 -> 24 (from --set MAX_NUM_SEQS)",
    ]
    only_file = plan_of("dflash-tp4-dcp4", env_file={"MAX_NUM_SEQS": "16"})
    assert flag_value(only_file.argv, "--max-num-seqs") == "16" and not only_file.qualified


def test_smoke_default_url_is_the_host_port_compose_publishes():
    from launch.settings import Settings

    port = load("cpu-tiny").profile.deployment.port
    assert Settings(environ={"HOST_PORT": "8100"}).url(port) == "http://127.0.0.1:8100"
    assert Settings(env_file={"HOST_PORT": "8200"}).url(port) == "http://127.0.0.1:8200"
    assert Settings().url(port) == f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("environ", "flag", "value"),
    [
        ({"MAX_MODEL_LEN": "128k"}, "--max-model-len", "128000"),
        ({"MAX_MODEL_LEN": "256K"}, "--max-model-len", "262144"),
        ({"KV_CACHE_MEMORY": "12G"}, "--kv-cache-memory-bytes", "12884901888"),
        # the IEC units the kit prints and vLLM logs ("15.87 GiB available for KV")
        ({"KV_CACHE_MEMORY": "12GiB"}, "--kv-cache-memory-bytes", "12884901888"),
        ({"KV_CACHE_MEMORY": "12 GiB"}, "--kv-cache-memory-bytes", "12884901888"),
        ({"KV_CACHE_MEMORY": "15.87 GiB"}, "--kv-cache-memory-bytes", "17040282746"),
        ({"KV_CACHE_MEMORY": "12g"}, "--kv-cache-memory-bytes", "12000000000"),
        ({"MAX_NUM_BATCHED_TOKENS": "8K"}, "--max-num-batched-tokens", "8192"),
    ],
)
def test_size_suffixes_read_as_vllm_reads_them(environ, flag, value):
    assert flag_value(plan("dflash-tp4-dcp4", environ).argv, flag) == value


def test_a_broken_profile_file_is_named_and_the_others_still_list(tmp_path, monkeypatch, capsys):
    import shutil

    from launch import loader
    from launch.__main__ import main
    from launch.commands import list_cmd

    for name in profile_names():
        shutil.copy(loader.PROFILE_DIR / f"{name}.yaml", tmp_path)
    (tmp_path / "bad.yaml").write_text("name: bad\nengine: [unclosed\n")
    monkeypatch.setattr(loader, "PROFILE_DIR", tmp_path)
    monkeypatch.setattr(list_cmd, "PROFILE_DIR", tmp_path)
    assert main(["list"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"bad                  BROKEN {tmp_path / 'bad.yaml'}: profile=")
    assert "is not valid YAML" in out[0]
    assert [line.split()[0] for line in out[1:]] == profile_names()[1:]


def test_a_refused_value_from_compose_env_says_where_it_came_from():
    from launch.errors import UsageError

    with pytest.raises(UsageError) as caught:
        plan_of("dflash-tp4-dcp4", env_file={"MAX_NUM_SEQS": "8"})
    assert caught.value.field == "engine.compilation_config.max_cudagraph_capture_size"
    origin = "engine.max_num_seqs: 32 -> 8 (from compose/.env MAX_NUM_SEQS)"
    assert f"(overrides in effect: {origin})" in str(caught.value)


def test_an_expectation_name_that_expect_does_not_have_is_refused_where_written():
    """Expectation keys are Expect's own field names: a typo raises instead of filtering out
    nothing (it once dropped no expectation, silently)."""
    from launch.capabilities import Requirement
    from launch.deviations import EXPECT_KEYS

    assert "kv_cache_tokens" in EXPECT_KEYS and "sources" not in EXPECT_KEYS
    with pytest.raises(ValueError, match="'kv_cache_token' is not an expectation"):
        NotChecked("kv_cache_token", "a typo")
    with pytest.raises(ValueError, match="'page_byte' is not an expectation"):
        Requirement("x", "engine.x", "1", "needs", "fallback", lambda _: True, lambda p: p,
                    ("page_byte",))  # fmt: skip


SCHEMA_PROBLEMS = [
    # (where, value, message): each a profile YAML mistake, refused by pydantic over the model
    (("engine", "max_num_seq"), 3,
     "engine.max_num_seq=3: unknown key (a typo would otherwise be ignored). "
     "Fix: did you mean 'max_num_seqs'?"),
    (("engine", "max_num_seqs"), "16", "engine.max_num_seqs='16': must be an integer"),
    (("engine", "max_num_seqs"), True, "engine.max_num_seqs=True: must be an integer"),
    (("engine", "speculative_config", "num_speculative_tokens"), 7.5,
     "engine.speculative_config.num_speculative_tokens=7.5: must be an integer"),
    (("deployment", "gpu_devices"), 3,
     "deployment.gpu_devices=3: must be a list of an integer. Fix: write it as a list"),
    (("deployment", "gpu_devices"), [0, "x"], "deployment.gpu_devices[1]='x': must be an integer"),
    (("engine",), 5, "engine=5: must be a mapping of keys to values"),
    (("engine", "additional_config"), [1], "engine.additional_config=[1]: must be a mapping"),
    (("expect", "block_sizes", "draft"), "x", "expect.block_sizes.draft='x': must be an integer"),
    (("engine", "revision"), __import__("datetime").date(2026, 1, 1),
     "engine.revision=datetime.date(2026, 1, 1): is not plain YAML data"),
]  # fmt: skip


@pytest.mark.parametrize(("where", "value", "message"), SCHEMA_PROBLEMS)
def test_schema_refuses_each_mistake_naming_its_path(where, value, message):
    from launch.errors import UsageError
    from launch.loader import read_raw
    from launch.profile import Profile
    from launch.schema import build

    raw = read_raw("dflash-tp4-dcp4")
    parent = raw
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    with pytest.raises(UsageError) as refused:
        build(Profile, raw, "")
    assert str(refused.value).startswith(message)


def test_a_missing_required_key_is_named():
    from launch.errors import UsageError
    from launch.loader import read_raw
    from launch.profile import Profile
    from launch.schema import build

    raw = read_raw("dflash-tp4-dcp4")
    del raw["engine"]["model"]
    raw["engine"]["modle"] = "x"  # the misspelling is what the user needs to hear about
    with pytest.raises(UsageError, match=r"^engine.modle='x': unknown key .* mean 'model'"):
        build(Profile, raw, "")
    del raw["engine"]["modle"]
    with pytest.raises(UsageError, match=r"^engine.model=None: is required"):
        build(Profile, raw, "")

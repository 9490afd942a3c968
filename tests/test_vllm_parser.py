"""Rendered commands parse with vLLM 0.34.0's own `vllm serve` parser, installed CPU-only.

Not a copied flag list: the argv goes through `make_arg_parser`, the parsed values are compared
with the profile, and the nested JSON configs are checked against vLLM's config classes.
"""

from __future__ import annotations

import dataclasses
import typing

import pytest

from launch.capabilities import requirements
from launch.kv_offload import OFF
from launch.loader import load, profile_names
from launch.profile import CompilationConfig, SpeculativeConfig
from launch.vllm_install import find_vllm
from launch.vllm_vocab import (
    CUDAGRAPH_MODES,
    GLM53_SPEC_METHODS,
    KV_CACHE_DTYPES,
    KV_OFFLOADING_BACKENDS,
    MAMBA_CACHE_MODES,
    VLLM_VERSION,
)
from tests.conftest import plan_of

VARIANTS = [
    ("dflash-tp4-dcp4", {}),
    ("mtp3-tp4-split", {}),
    ("mtp3-tp4-split", {"CACHE_MODE": "native", "KV_OFFLOADING_SIZE_GB": "24"}),
    ("cpu-tiny", {}),
    ("cpu-tiny", {"VLLM_EXTRA_ARGS": "--seed 7 --max-logprobs 5"}),
    (
        "dflash-tp4-dcp4",
        {
            "KV_CACHE_MEMORY": "none",
            "GPU_MEMORY_UTILIZATION": "0.95",
            "GPU_DEVICES": "4,5,6,7",
            "PORT": "9000",
        },
    ),
    (
        "dflash-tp4-dcp4",
        {
            "NUM_SPECULATIVE_TOKENS": "5",
            "MAX_NUM_SEQS": "16",
            "MAX_CUDAGRAPH_CAPTURE_SIZE": "64",
            "CUDAGRAPH_MODE": "FULL_AND_PIECEWISE",
        },
    ),
    ("mtp3-tp4-split", {"MAX_MODEL_LEN": "131072", "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE": "1024",
                        "VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE": "1024"}),
]


@pytest.fixture(scope="module")
def serve_parser():
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def _flatten_literal(t: object) -> set[str]:
    out: set[str] = set()
    for arg in typing.get_args(t):
        if typing.get_origin(arg) is typing.Literal:
            out |= _flatten_literal(arg)
        else:
            out.add(arg)
    return out


@pytest.mark.parametrize(("name", "environ"), VARIANTS)
def test_rendered_argv_parses_with_vllm_serve_parser(serve_parser, name, environ):
    plan = plan_of(name, environ)
    assert plan.argv[:2] == ("vllm", "serve")
    args = serve_parser.parse_args(list(plan.argv[2:]))
    engine = plan.profile.engine
    assert args.model_tag == engine.model
    for field in dataclasses.fields(engine):
        value = getattr(engine, field.name)
        if field.name in ("model", "extra_args") or value is None:
            continue
        parsed = getattr(args, field.name, None)
        if field.name == "compilation_config":
            for key, v in dataclasses.asdict(value).items():
                if v is not None:
                    got = getattr(parsed, key)
                    assert (got.name if hasattr(got, "name") else got) == v
        elif field.name == "speculative_config":
            assert parsed == {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
        elif field.name == "served_model_name":
            assert parsed == [value]
        elif field.name == "kv_offload":  # vLLM's --kv-offloading-backend / -size
            size = None if value.backend == OFF else value.size_gib
            assert args.kv_offloading_size == size
            if size is not None:
                assert args.kv_offloading_backend == value.backend
        else:
            assert parsed == value, field.name
    if engine.extra_args:  # passed through as written, read by vLLM's parser
        assert (args.seed, args.max_logprobs) == (7, 5)
    assert args.host == plan.profile.deployment.host
    assert args.port == plan.profile.deployment.port


def test_nested_config_keys_are_vllm_config_fields():
    from vllm.config import CompilationConfig as VllmCompilation
    from vllm.config import SpeculativeConfig as VllmSpeculative

    vllm_spec_fields = {f for f in VllmSpeculative.__dataclass_fields__}
    assert {f.name for f in dataclasses.fields(SpeculativeConfig)} <= vllm_spec_fields
    vllm_cc_fields = set(VllmCompilation.__dataclass_fields__)
    assert {f.name for f in dataclasses.fields(CompilationConfig)} <= vllm_cc_fields
    for name in profile_names():
        cc = load(name).profile.engine.compilation_config
        if cc is None:  # cpu-tiny: --enforce-eager, no compilation config
            continue
        built = VllmCompilation(
            **{k: v for k, v in dataclasses.asdict(cc).items() if v is not None}
        )
        assert built.cudagraph_mode.name == cc.cudagraph_mode


def test_validator_vocabulary_matches_installed_vllm():
    from vllm.config.cache import CacheDType, KVOffloadingBackend, MambaCacheMode
    from vllm.config.compilation import CUDAGraphMode
    from vllm.config.speculative import SpeculativeMethod

    assert {m.name for m in CUDAGraphMode} == CUDAGRAPH_MODES
    assert _flatten_literal(CacheDType) == KV_CACHE_DTYPES
    assert _flatten_literal(MambaCacheMode) == MAMBA_CACHE_MODES
    assert _flatten_literal(KVOffloadingBackend) == KV_OFFLOADING_BACKENDS
    assert _flatten_literal(SpeculativeMethod) >= GLM53_SPEC_METHODS


def test_capability_detection_on_upstream_vllm():
    install = find_vllm()
    assert install is not None and install.version == VLLM_VERSION
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert install.attention_backends == {m.name for m in AttentionBackendEnum}
    assert "FLASH_ATTN" in install.attention_backends
    assert "B12X_MLA_SPARSE" not in install.attention_backends
    assert "kda_prefill_backend" in install.additional_config_keys  # an upstream key
    met = {
        name: {r.name: r.met(install) for r in requirements(load(name).profile)}
        for name in profile_names()
    }
    parsers = {"reasoning_parser": True, "tool_call_parser": True}  # glm45 / glm47 upstream
    assert met == {
        "cpu-tiny": parsers,  # no fork knob
        "dflash-tp4-dcp4": {
            "b12x_pcie_allreduce": False,
            "dcp_ckv_gather": False,
            "attention_backend": False,  # B12X_MLA_SPARSE is the fork's
            "draft_attention_backend": True,  # FLASH_ATTN is upstream
            "glm53_kda_decode_backend": False,
            **parsers,
        },
        "mtp3-tp4-split": {
            "split_pages": False,  # provided by patches/vllm, not by the pristine wheel
            "attention_backend": False,  # B12X_MLA_SPARSE is the fork's
            "draft_attention_backend": False,
            **parsers,
        },
    }


def test_size_suffixes_are_vllms_own(serve_parser):
    from vllm.utils.argparse_utils import human_readable_int as vllm_human_readable_int

    from launch.profile import EngineArgs
    from launch.vllm_vocab import HUMAN_READABLE_INT_FIELDS, human_readable_int

    for text in ("128k", "128K", "12G", "12g", "25.6k", "1T", "3m"):
        assert human_readable_int(text) == vllm_human_readable_int(text), text
    # the integer fields of the kit's EngineArgs whose vLLM flag reads "1K" as 1,024
    accepts = set()
    for name, hint in typing.get_type_hints(EngineArgs).items():
        if int not in typing.get_args(hint) and hint is not int:
            continue
        flag = "--" + name.replace("_", "-")
        try:
            parsed = serve_parser.parse_args(["some/model", flag, "1K"])
        except SystemExit:
            continue
        if getattr(parsed, name) == 1024:
            accepts.add(name)
    assert accepts == HUMAN_READABLE_INT_FIELDS

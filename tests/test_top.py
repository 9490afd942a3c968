"""`make top`'s arithmetic on the real CPU engine's /metrics (tests/fixtures), and its command
against the fast stand-in (tests/standin_fast.py, a test double whose counters move with the
requests it serves). The real engine is read by `make top --once --json` in `make e2e`."""

from __future__ import annotations

import json
import threading

import pytest
import requests
import yaml

from launch.compose_config import REPLICAS_FILE, compose_document
from serving.__main__ import main
from serving.commands.top_cmd import CLEAR, watch
from serving.served import replica_urls
from serving.top import reading, screen, view
from smoke.client import Server
from smoke.metrics import TTFT, histogram_buckets, histogram_quantile
from tests.conftest import plan_of
from tests.test_bench import standin
from tests.test_dashboard import CPU_METRICS


def test_quantiles_interpolate_inside_the_bucket_as_prometheus_does():
    buckets = histogram_buckets(CPU_METRICS)[TTFT]
    assert buckets[float("inf")] == 2452.0
    # the 1,226th of 2,452 observations is in (0.005, 0.01], which holds 92..1,400
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.005 + 0.005 * (1226 - 92) / 1308)
    assert 0.25 < histogram_quantile(0.99, buckets) <= 0.5  # 2,427.48 lies in (0.25, 0.5]
    assert histogram_quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert histogram_quantile(0.9, {0.1: 1.0, float("inf"): 10.0}) == 0.1  # in +Inf: the bound


def test_an_idle_interval_has_rates_of_zero_and_no_latency():
    before, after = reading(CPU_METRICS, 0.0), reading(CPU_METRICS, 2.0)
    shown = view(before, after)
    assert shown.requests_per_s == 0.0 and shown.generation_tok_s == 0.0
    assert shown.ttft_p50_s is None and shown.acceptance_length is None
    assert shown.running == 0.0 and shown.kv_usage == 0.0
    # a restarted server's counters start again from zero: never a negative rate
    assert view(after, reading("", 4.0)).requests_per_s is None


def test_top_once_json_against_a_server_under_load(capsys):
    with standin() as url:
        stop = threading.Event()

        def load() -> None:  # until top has read its interval, however long its start takes
            while not stop.is_set():
                requests.post(f"{url}/v1/chat/completions", timeout=10, json={
                    "model": "m", "max_tokens": 30, "messages": [{"role": "user",
                                                                  "content": "hi"}]})
        thread = threading.Thread(target=load)
        thread.start()
        try:
            code = main(["top", "--profile", "cpu-tiny", "--url", url, "--once", "--json",
                         "--interval", "1"])  # fmt: skip
        finally:
            stop.set()
            thread.join()
    assert code == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["seconds"] == pytest.approx(1.0, abs=0.5)
    assert shown["acceptance_length"] > 1.0  # the double drafts as it serves
    assert shown["generation_tok_s"] is None  # it exposes no generation counter


def test_a_server_that_does_not_answer_is_exit_1_and_bad_usage_exit_2(capsys):
    assert main(["top", "--profile", "cpu-tiny", "--url", "http://127.0.0.1:9", "--once"]) == 1
    assert "error: http://127.0.0.1:9/metrics" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["top", "--profile", "cpu-tiny", "--interval", "0"])
    assert usage.value.code == 2


def test_the_screen_has_a_row_per_server_and_says_why_one_is_missing():
    before, after = reading(CPU_METRICS, 0.0), reading(CPU_METRICS, 1.0)
    text = screen([("vllm-0", view(before, after)), ("vllm-1", "no answer: refused")],
                  "10:00:00", 1.0)  # fmt: skip
    lines = text.splitlines()
    assert lines[0].startswith("glm53 top  10:00:00  every 1 s")
    header, row = lines[2].split(), lines[3].split()
    assert header[:3] == ["server", "running", "waiting"] and len(header) == len(row)
    assert row[0] == "vllm-0" and row[header.index("gen/s")] == "0.0"
    assert lines[4] == "vllm-1: no answer: refused"


def test_every_replica_is_watched_on_one_screen(tmp_path, capsys):
    """Two servers (two stand-ins) on one screen per refresh: a row each, the second's row an
    error once it stops answering, and the view goes on."""
    shown: list[str] = []
    with standin() as first, standin() as second:
        servers = {name: Server(url, "m", timeout=5) for name, url in
                   (("vllm-0", first), ("vllm-1", second))}  # fmt: skip
        ticks = iter(range(3))

        def sleep(_: float) -> None:
            tick = next(ticks)
            if tick == 1:  # the second stops answering before the second refresh
                servers["vllm-1"] = Server("http://127.0.0.1:9", "m", timeout=2)
            if tick == 2:
                raise KeyboardInterrupt

        assert watch(servers, 1.0, once=False, as_json=False, on_screen=True,
                     out=shown.append, sleep=sleep) == 0  # fmt: skip
    assert len(shown) == 2 and all(s.startswith(CLEAR) for s in shown)
    assert [line.split()[0] for line in shown[0].splitlines()[3:]] == ["vllm-0", "vllm-1"]
    last = shown[1].splitlines()[3:]
    assert last[0].split()[0] == "vllm-0" and last[1].startswith("vllm-1: no answer: ")


def test_the_replicas_of_a_scaled_out_service_are_found_where_compose_publishes_them(tmp_path):
    plan = plan_of("cpu-tiny")
    doc = compose_document(plan, None, 2, 8000, "127.0.0.1")
    replicas = tmp_path / REPLICAS_FILE.name
    replicas.write_text(yaml.safe_dump(doc))
    assert replica_urls({"COMPOSE_FILE": REPLICAS_FILE.name}, replicas) == {
        "vllm-0": "http://127.0.0.1:8001", "vllm-1": "http://127.0.0.1:8002"}
    assert replica_urls({"COMPOSE_FILE": "compose.yaml:cpu.yaml"}, replicas) == {}

"""`make top`'s arithmetic on the real CPU engine's /metrics (tests/fixtures), and its command
against the fast stand-in (tests/standin_fast.py, a test double whose counters move with the
requests it serves). The real engine is read by `make top --once --json` in `make e2e`."""

from __future__ import annotations

import json
import threading

import pytest
import requests

from smoke.__main__ import main
from smoke.bench.metrics import TTFT, histogram_buckets, histogram_quantile
from smoke.top import reading, view
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

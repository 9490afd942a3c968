"""Fail-closed checks on a built profile: every rule the seeds and vLLM imply, before a start.

Each rule is a pure function of the profile that raises `UsageError` with the field, the value,
the rule and a fix. `validate` runs them in order and stops at the first violation, so the user
gets one clear message.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from launch.errors import UsageError
from launch.glm53 import GLM53
from launch.gpus import example_gpus, gpu_list_problem
from launch.image_lock import SOURCES as IMAGE_SOURCES
from launch.kv_offload import (
    GIB,
    OFF,
    gib,
    host_memory,
    region_bytes,
    shm_needed_bytes,
    vllm_shm_bytes,
)
from launch.overrides import ENV_OVERRIDES
from launch.profile import Profile
from launch.render import rendered_flags
from launch.vllm_vocab import (
    CUDAGRAPH_MODES,
    GLM53_SPEC_METHODS,
    KV_CACHE_DTYPES,
    KV_OFFLOADING_BACKENDS,
    MAMBA_CACHE_MODES,
)

_COMMIT = re.compile(r"[0-9a-f]{40}")
DEVICES = ("cuda", "cpu")

Rule = Callable[[Profile], None]


def _positive(field: str, value: int | None, fix: str) -> None:
    if value is not None and value <= 0:
        raise UsageError(field, value, "must be a positive integer", fix)


def check_parallel_sizes(p: Profile) -> None:
    e = p.engine
    _positive(
        "engine.tensor_parallel_size", e.tensor_parallel_size, "set TP to 4 for these profiles"
    )
    _positive("engine.pipeline_parallel_size", e.pipeline_parallel_size, "set PP to 1")
    _positive(
        "engine.decode_context_parallel_size", e.decode_context_parallel_size, "set DCP to 1 or 4"
    )
    if e.tensor_parallel_size % e.decode_context_parallel_size:
        raise UsageError(
            "engine.decode_context_parallel_size",
            e.decode_context_parallel_size,
            f"must divide tensor_parallel_size ({e.tensor_parallel_size}); DCP shards the KV cache "
            "across ranks of the TP group",
            f"use a divisor of TP, e.g. DCP={e.tensor_parallel_size} or DCP=1",
        )


def check_interleave(p: Profile) -> None:
    e = p.engine
    size = e.cp_kv_cache_interleave_size
    _positive("engine.cp_kv_cache_interleave_size", size, "use 1, or 4 as qualified with DCP4")
    if e.decode_context_parallel_size == 1 and size != 1:
        raise UsageError(
            "engine.cp_kv_cache_interleave_size",
            size,
            "has no meaning without context parallelism (DCP=1)",
            "set CP_KV_CACHE_INTERLEAVE_SIZE=1 or raise DCP",
        )
    split = p.features.split_pages
    if split is not None and split.target_block_size % size:
        raise UsageError(
            "engine.cp_kv_cache_interleave_size",
            size,
            f"must divide the target block size ({split.target_block_size}); vLLM requires block "
            "sizes divisible by the interleave size",
            "use a power of two that divides the target block, e.g. 1 or 4",
        )


def check_device(p: Profile) -> None:
    d = p.deployment
    if d.device not in DEVICES:
        raise UsageError(
            "deployment.device", d.device, "is not a device the kit serves on",
            f"use one of {', '.join(DEVICES)}",
        )  # fmt: skip
    if d.device == "cpu" and d.gpu_devices:
        raise UsageError(
            "deployment.gpu_devices",
            ",".join(map(str, d.gpu_devices)),
            "lists GPUs for a CPU profile (vLLM's CPU build uses none)",
            "set gpu_devices: [] or use a cuda profile",
        )


def check_gpus(p: Profile) -> None:
    if p.deployment.device == "cpu":
        return
    gpus, need = p.deployment.gpu_devices, p.engine.world_size
    problem = gpu_list_problem(gpus, need)
    if problem:
        raise UsageError("deployment.gpu_devices", ",".join(map(str, gpus)), problem,
                         f"list {need} distinct GPUs, e.g. GPU_DEVICES={example_gpus(need)}")


def check_lengths(p: Profile) -> None:
    e = p.engine
    _positive("engine.max_model_len", e.max_model_len, "set MAX_MODEL_LEN to a token count")
    _positive("engine.max_num_seqs", e.max_num_seqs, "set MAX_NUM_SEQS to at least 1")
    _positive(
        "engine.max_num_batched_tokens",
        e.max_num_batched_tokens,
        "set MAX_NUM_BATCHED_TOKENS, e.g. 8192",
    )


def check_memory(p: Profile) -> None:
    e = p.engine
    if e.kv_cache_memory_bytes is not None and e.gpu_memory_utilization is not None:
        raise UsageError(
            "engine.gpu_memory_utilization",
            e.gpu_memory_utilization,
            f"cannot be combined with kv_cache_memory_bytes ({e.kv_cache_memory_bytes}); vLLM "
            "sizes the KV cache from one or the other",
            "unset one: KV_CACHE_MEMORY=none to budget by utilization, or drop "
            "GPU_MEMORY_UTILIZATION",
        )
    _positive(
        "engine.kv_cache_memory_bytes",
        e.kv_cache_memory_bytes,
        "give a byte count, e.g. KV_CACHE_MEMORY=12GiB (12884901888 bytes)",
    )
    util = e.gpu_memory_utilization
    if util is not None and not 0.0 < util <= 1.0:
        raise UsageError(
            "engine.gpu_memory_utilization",
            util,
            "must be a fraction in (0, 1]",
            "e.g. GPU_MEMORY_UTILIZATION=0.92",
        )


def check_vocabulary(p: Profile) -> None:
    e = p.engine
    cc = e.compilation_config
    if (
        cc is not None
        and cc.cudagraph_mode is not None
        and cc.cudagraph_mode not in CUDAGRAPH_MODES
    ):
        raise UsageError(
            "engine.compilation_config.cudagraph_mode",
            cc.cudagraph_mode,
            "is not a vLLM CUDA graph mode",
            f"use one of {', '.join(sorted(CUDAGRAPH_MODES))}",
        )
    for field, dtype in (
        ("engine.kv_cache_dtype", e.kv_cache_dtype),
        (
            "engine.speculative_config.kv_cache_dtype",
            e.speculative_config.kv_cache_dtype if e.speculative_config else None,
        ),
    ):
        if dtype is not None and dtype not in KV_CACHE_DTYPES:
            raise UsageError(
                field,
                dtype,
                "is not a vLLM KV cache dtype",
                "use auto, fp8 or another vLLM CacheDType",
            )
    if e.mamba_cache_mode is not None and e.mamba_cache_mode not in MAMBA_CACHE_MODES:
        raise UsageError(
            "engine.mamba_cache_mode",
            e.mamba_cache_mode,
            "is not a vLLM mamba cache mode",
            f"use one of {', '.join(sorted(MAMBA_CACHE_MODES))}",
        )


def check_speculative(p: Profile) -> None:
    e = p.engine
    spec = e.speculative_config
    if spec is None:
        return
    if spec.method not in GLM53_SPEC_METHODS:
        raise UsageError(
            "engine.speculative_config.method",
            spec.method,
            "is not a speculative method vLLM offers for a GLM-5.3 target",
            f"use one of {', '.join(sorted(GLM53_SPEC_METHODS))}",
        )
    k = spec.num_speculative_tokens
    _positive(
        "engine.speculative_config.num_speculative_tokens",
        k,
        "set NUM_SPECULATIVE_TOKENS to the draft depth, e.g. 7 for DFlash or 3 for MTP",
    )
    if spec.method == "dflash" and spec.model is None:
        raise UsageError(
            "engine.speculative_config.model",
            None,
            "a DFlash draft needs its own checkpoint",
            "set speculative_config.model to the draft repository",
        )
    if spec.method == "mtp" and spec.model is not None:
        raise UsageError(
            "engine.speculative_config.model",
            spec.model,
            "MTP uses the target checkpoint's own head, not a separate model",
            "remove speculative_config.model",
        )
    step = e.tokens_per_step
    batched = e.max_num_batched_tokens
    if batched is not None and step > batched:
        raise UsageError(
            "engine.speculative_config.num_speculative_tokens",
            k,
            f"a decode step of one request verifies {step} tokens, more than "
            f"max_num_batched_tokens ({batched})",
            "lower NUM_SPECULATIVE_TOKENS or raise MAX_NUM_BATCHED_TOKENS",
        )


def check_capture_size(p: Profile) -> None:
    e = p.engine
    cc = e.compilation_config
    size = cc.max_cudagraph_capture_size if cc else None
    if size is None:
        return
    _positive(
        "engine.compilation_config.max_cudagraph_capture_size",
        size,
        "set MAX_CUDAGRAPH_CAPTURE_SIZE, e.g. 128",
    )
    per_seq = e.tokens_per_step
    if e.max_num_seqs is not None:
        needed = e.max_num_seqs * per_seq
        if size > needed:
            raise UsageError(
                "engine.compilation_config.max_cudagraph_capture_size",
                size,
                f"exceeds the largest decode batch max_num_seqs x (1 + speculative tokens) = "
                f"{e.max_num_seqs} x {per_seq} = {needed}; graphs above it are never replayed",
                f"set MAX_CUDAGRAPH_CAPTURE_SIZE to at most {needed}, or raise MAX_NUM_SEQS",
            )
    if e.max_num_batched_tokens is not None and size > e.max_num_batched_tokens:
        raise UsageError(
            "engine.compilation_config.max_cudagraph_capture_size",
            size,
            f"exceeds max_num_batched_tokens ({e.max_num_batched_tokens})",
            "lower MAX_CUDAGRAPH_CAPTURE_SIZE",
        )


def check_split_pages(p: Profile) -> None:
    split = p.features.split_pages
    if split is None:
        return
    _positive(
        "features.split_pages.target_block_size",
        split.target_block_size,
        "set VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE, e.g. 512",
    )
    _positive(
        "features.split_pages.mamba_block_size",
        split.mamba_block_size,
        "set VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE, e.g. 512",
    )
    if split.mamba_block_size != split.target_block_size:
        # vLLM's align-mode scheduler splits chunks at one block size (cache_config.block_size)
        # while the recurrent manager checkpoints at its own: unequal sizes can resume recurrent
        # state from the wrong checkpoint on a prefix-cache hit (vLLM issue #54076).
        raise UsageError(
            "features.split_pages.mamba_block_size",
            split.mamba_block_size,
            f"must equal the target block ({split.target_block_size}): the scheduler's "
            "align-mode split uses one block size for both",
            f"set VLLM_GLM53_SPLIT_MAMBA_BLOCK_SIZE={split.target_block_size}",
        )
    if p.architecture != GLM53:
        raise UsageError(
            "architecture",
            p.architecture,
            f"split pages exist only for {GLM53}",
            "remove features.split_pages",
        )
    if p.engine.mamba_cache_mode != "align":
        raise UsageError(
            "engine.mamba_cache_mode",
            p.engine.mamba_cache_mode,
            "split pages require mamba_cache_mode=align",
            "set engine.mamba_cache_mode: align, or remove features.split_pages",
        )


def check_revisions(p: Profile) -> None:
    e = p.engine
    if e.model_is_local:
        if e.revision is not None:
            raise UsageError(
                "engine.revision",
                e.revision,
                f"has no meaning for a model directory ({e.model}); revisions pin Hub repositories",
                "remove engine.revision, or name a Hub repository as the model",
            )
        return
    if p.deployment.allow_floating_revision:
        return
    pins = [("engine.revision", e.revision, "MODEL_REVISION")]
    if e.speculative_config is not None and e.speculative_config.model is not None:
        pins.append(
            (
                "engine.speculative_config.revision",
                e.speculative_config.revision,
                "DFLASH_MODEL_REVISION",
            )
        )
    for field, rev, env in pins:
        if rev is None or not _COMMIT.fullmatch(rev):
            raise UsageError(
                field,
                rev,
                "must be a full 40-hex commit; a branch or tag can move under a running deployment",
                f"set {env} to the commit SHA, or opt out with ALLOW_FLOATING_REVISION=1",
            )


def check_expectations(p: Profile) -> None:
    x = p.expect
    if (x.max_concurrency_min is None) != (x.max_concurrency_tokens is None):
        raise UsageError(
            "expect.max_concurrency_tokens",
            x.max_concurrency_tokens,
            "a concurrency floor means nothing without the request length it is for (vLLM "
            "reports concurrency for max_model_len tokens per request)",
            "set both expect.max_concurrency_min and expect.max_concurrency_tokens, or neither",
        )
    if x.max_concurrency_tokens is not None and x.max_concurrency_tokens != p.engine.max_model_len:
        raise UsageError(
            "expect.max_concurrency_tokens",
            x.max_concurrency_tokens,
            f"differs from engine.max_model_len ({p.engine.max_model_len}), the length vLLM "
            "reports concurrency for",
            "state the floor for max_model_len tokens",
        )
    if x.spec_acceptance_length_min is not None and p.engine.speculative_config is None:
        raise UsageError(
            "expect.spec_acceptance_length_min",
            x.spec_acceptance_length_min,
            "an acceptance floor for a profile that does not speculate",
            "remove it, or set engine.speculative_config",
        )
    if x.spec_acceptance_length_min is not None and x.spec_acceptance_length_min < 1.0:
        raise UsageError(
            "expect.spec_acceptance_length_min",
            x.spec_acceptance_length_min,
            "is below 1.0; every draft round yields at least the target's own token",
            "state the mean acceptance length (1 + accepted / drafts), e.g. 2.1",
        )


def check_smoke(p: Profile) -> None:
    sm = p.smoke
    if not 0.0 <= sm.needle_depth <= 1.0:
        raise UsageError("smoke.needle_depth", sm.needle_depth, "must be within 0..1",
                         "e.g. 0.5 (half-way into the prompt)")  # fmt: skip
    limit = p.engine.max_model_len
    if sm.context_tokens is not None and limit is not None and sm.context_tokens >= limit:
        raise UsageError(
            "smoke.context_tokens", sm.context_tokens,
            f"leaves no room to answer within engine.max_model_len ({limit})",
            f"use fewer than {limit} tokens",
        )  # fmt: skip


def check_extra_args(p: Profile) -> None:
    extra = p.engine.extra_args
    if extra and not extra[0].startswith("--"):
        raise UsageError(
            "engine.extra_args", " ".join(extra), "must start with a --flag",
            'e.g. VLLM_EXTRA_ARGS="--seed 7 --max-logprobs 5"',
        )  # fmt: skip
    rendered = rendered_flags()
    variables = {path: name for name, path in ENV_OVERRIDES.items()}
    for arg in extra:
        name = arg.split("=", 1)[0]
        base = "--" + name[5:] if name.startswith("--no-") else name
        if base in rendered:
            field = rendered[base]
            variable = f"{variables[field]}=..., or " if field in variables else ""
            raise UsageError(
                "engine.extra_args", arg,
                f"sets {base}, which the profile renders from {field}",
                f"set {field} instead ({variable}--set {field}=...)",
            )  # fmt: skip


def check_kv_offload(p: Profile) -> None:
    """The host tier: a known mode, a positive size, a device vLLM offloads from, and (native)
    shared memory for its region plus vLLM's own queues. Host memory is checked at run time."""
    o = p.engine.kv_offload
    if o is None:
        return
    modes = (OFF, *sorted(KV_OFFLOADING_BACKENDS))
    if o.backend not in modes:
        raise UsageError("engine.kv_offload.backend", o.backend, "is not a KV cache mode",
                         f"use one of {', '.join(modes)} (CACHE_MODE)")  # fmt: skip
    if o.size_gib <= 0:
        raise UsageError("engine.kv_offload.size_gib", o.size_gib, "must be a positive "
                         "number of GiB", "e.g. KV_OFFLOADING_SIZE_GB=64")  # fmt: skip
    if o.backend == OFF:
        return
    if p.deployment.device == "cpu":
        raise UsageError(
            "engine.kv_offload.backend", o.backend,
            "offloads a GPU KV cache; vLLM's CPU build refuses it at start ('CPU Offloading is "
            "currently only supported on CUDA-alike and XPU GPUs', v1/kv_offload/cpu/spec.py)",
            "leave CACHE_MODE unset (or vram) for CPU profiles",
        )  # fmt: skip
    if o.backend != "native":
        return  # LMCache's own server holds its tiers; vLLM maps no region for it
    world = p.engine.world_size
    need, have = shm_needed_bytes(o.size_gib, world), p.deployment.shm_size_gib * GIB
    if need > have:
        raise UsageError(
            "deployment.shm_size_gib", p.deployment.shm_size_gib,
            f"is too small for the native KV tier: its /dev/shm region "
            f"{gib(region_bytes(o.size_gib))} + vLLM's own {gib(vllm_shm_bytes(world))} "
            f"({world} workers) = {gib(need)} needed, {gib(have)} given",
            f"SHM_SIZE_GIB={-(-need // GIB)}, or a smaller KV_OFFLOADING_SIZE_GB",
        )  # fmt: skip


def check_host_memory(p: Profile, available: int | None) -> None:
    """At run time (`make up`, `launch run`): the server's shared memory must fit in what the
    host can still give (`launch.kv_offload.HostMemory`, the rule `make doctor` applies too);
    `available` is read from /proc/meminfo and the cgroup by the caller."""
    if available is None:
        return
    memory = host_memory(p.engine.kv_offload, p.engine.world_size)
    if memory.need > available:
        o = p.engine.kv_offload
        raise UsageError("engine.kv_offload.size_gib" if memory.tier else "host memory",
                         o.size_gib if memory.tier and o else gib(memory.need),
                         memory.problem(available),
                         memory.fix(available))  # fmt: skip


def check_tool_choice(p: Profile) -> None:
    e = p.engine
    if e.enable_auto_tool_choice and not e.tool_call_parser:
        raise UsageError(
            "engine.enable_auto_tool_choice", True,
            "needs engine.tool_call_parser (vLLM refuses --enable-auto-tool-choice without one)",
            "set TOOL_CALL_PARSER (glm47 for GLM-5.x), or ENABLE_AUTO_TOOL_CHOICE=false",
        )  # fmt: skip


def check_port(p: Profile) -> None:
    port = p.deployment.port
    if not 1 <= port <= 65535:
        raise UsageError("deployment.port", port, "must be in 1..65535", "e.g. PORT=8000")


MAX_DRAIN_S = 3600
"""The longest drain on stop: an hour (a stop that waits longer is a hang to whoever stops it)."""


def check_runtime_sizes(p: Profile) -> None:
    _positive("deployment.shm_size_gib", p.deployment.shm_size_gib, "e.g. SHM_SIZE_GIB=64")
    _positive(
        "deployment.startup_budget_s",
        p.deployment.startup_budget_s,
        "e.g. STARTUP_BUDGET_S=2400 (40 minutes)",
    )
    drain = p.deployment.drain_s
    if not 0 <= drain <= MAX_DRAIN_S:
        raise UsageError(
            "deployment.drain_s", drain,
            f"must be 0 (abort requests in flight at once) to {MAX_DRAIN_S} seconds",
            "e.g. DRAIN_S=60",
        )  # fmt: skip


def check_image_source(p: Profile) -> None:
    if p.deployment.image not in IMAGE_SOURCES:
        raise UsageError(
            "deployment.image",
            p.deployment.image,
            "is not an image source",
            f"use one of {', '.join(IMAGE_SOURCES)}",
        )


RULES: tuple[Rule, ...] = (
    check_device,
    check_parallel_sizes,
    check_gpus,
    check_interleave,
    check_lengths,
    check_memory,
    check_vocabulary,
    check_speculative,
    check_capture_size,
    check_split_pages,
    check_revisions,
    check_expectations,
    check_smoke,
    check_extra_args,
    check_kv_offload,
    check_tool_choice,
    check_port,
    check_runtime_sizes,
    check_image_source,
)


def validate(profile: Profile) -> Profile:
    """Run every rule; raise the first `UsageError`, else return the profile unchanged."""
    for rule in RULES:
        rule(profile)
    return profile

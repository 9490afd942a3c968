"""The engine core's own KV cache sizing, run on given specs and a given budget, without workers.

vLLM sizes the cache in `EngineCore._initialize_kv_caches`: it asks the executor for the workers'
specs, their supported layouts and the memory left for the cache, then plans (grouping, block
sizes, `get_kv_cache_configs`), sets the scheduler's block size and logs `KV cache size: N
tokens, Maximum concurrency for L tokens per request: Cx`. Here that very method runs with a
stand-in for the executor, the one part that needs GPUs and weights: it hands over specs built by
vLLM's own layer classes and the budget the question names, and keeps what the engine would
hand its workers. Whatever this vLLM's engine core does (0.32 and 0.33 differ), it does here.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from capacity.answer import EnginePlan, Refused
from kvgeometry.report import geometry_of


class _Executor:
    """The executor's side of `_initialize_kv_caches` for one rank's specs (every rank of a
    tensor-parallel start holds the same shapes), answering as vLLM's workers do."""

    def __init__(self, config: Any, specs: dict[str, Any], budget: int) -> None:
        self.config, self.specs, self.budget = config, specs, budget
        self.kv_cache_configs: list[Any] = []

    def _worker(self) -> Any:
        return SimpleNamespace(vllm_config=self.config)

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [dict(self.specs)]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        from vllm.v1.worker.worker_base import WorkerBase

        if self.config.cache_config.kv_cache_layout is not None:  # resolution keeps it as is
            return [[str(self.config.cache_config.kv_cache_layout)]]
        return [WorkerBase.get_supported_kv_cache_layouts(self._worker())]

    def set_kv_cache_layout(self, *args: Any) -> None:
        from vllm.v1.worker.worker_base import WorkerBase

        WorkerBase.set_kv_cache_layout(self._worker(), *args)

    def determine_available_memory(self) -> list[int]:
        return [self.budget]

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.kv_cache_configs = kv_cache_configs

    def compile_or_warm_up_model(self) -> None:
        return None

    def collective_rpc(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []


ONCE_CACHES = ("_print_debug_once", "_print_info_once", "_print_warning_once",
               "_print_error_once")  # fmt: skip
"""vLLM's `logger.info_once` and kin remember what they printed (functools caches in
vllm.logger); a start is a fresh process, so each planned start forgets them, before and after."""


def _forget_once_lines() -> None:
    import vllm.logger

    for name in ONCE_CACHES:
        cached = getattr(vllm.logger, name, None)
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextlib.contextmanager
def vllm_lines(logger_name: str = "vllm") -> Iterator[list[str]]:
    """Every message vLLM's logger `logger_name` (and those below it) emits at INFO and above
    inside the block, once-only lines included as a fresh start prints them."""
    logger = logging.getLogger(logger_name)
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _forget_once_lines()
    try:
        yield lines
    finally:
        _forget_once_lines()
        logger.removeHandler(handler)
        logger.setLevel(level)


def engine_plan(config: Any, specs: dict[str, Any], budget: int,
                max_model_len: int | None = None) -> EnginePlan | Refused:  # fmt: skip
    """`EngineCore._initialize_kv_caches` of this vLLM on `specs` with `budget` bytes for the
    cache, at `max_model_len` when given (on a copy of `config`: the engine core writes into
    it)."""
    from vllm.v1.engine.core import EngineCore

    config = copy.deepcopy(config)
    if max_model_len is not None:
        config.model_config.max_model_len = max_model_len
    executor = _Executor(config, specs, budget)
    core = SimpleNamespace(model_executor=executor, available_gpu_memory_for_kv_cache=-1,
                           collective_rpc=executor.collective_rpc)  # fmt: skip
    max_model_len = int(config.model_config.max_model_len)
    with vllm_lines() as lines:
        try:
            EngineCore._initialize_kv_caches(core, config)
        except ValueError as err:  # vLLM's own refusal (the cache cannot hold one request)
            return Refused(budget, max_model_len, str(err))
    if not executor.kv_cache_configs:
        raise RuntimeError("the engine core planned no KV cache (an attention-free model?)")
    cache = config.cache_config
    plan = executor.kv_cache_configs[0]
    plan.kv_cache_layout = cache.kv_cache_layout
    return EnginePlan(
        budget=budget, max_model_len=max_model_len, num_blocks=int(cache.num_gpu_blocks),
        tokens=int(cache.kv_cache_size_tokens),
        max_concurrency=float(cache.kv_cache_max_concurrency),
        geometry=geometry_of(config, plan), lines=tuple(lines),
    )  # fmt: skip

"""`log: capacity as predicted`: the running engine against `make capacity`'s prediction for the
very configuration it runs (`capacity.host.predict_start`: the profile's budget, planned by
vLLM's engine core in the same image). The engine's `KV cache size` line, the geometry plugin's
line and `/metrics` (`vllm:cache_config_info`) must each equal the prediction; a mismatch names
both values. Without a prediction (a budget from gpu_memory_utilization, an image that cannot
answer) the check is skipped, saying why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from capacity.answer import EnginePlan, Refused
from capacity.host import NotPredicted, StartPrediction
from launch.errors import UsageError
from launch.plan import Plan
from smoke.check import Check, Label, result, skipped
from smoke.client import CheckFailed, Server, metrics_text
from smoke.log_facts import LogFacts
from smoke.metrics import CACHE_INFO


def logged_concurrency(value: float) -> float:
    """A concurrency as the engine core logs it (`%.2fx`) and the log parser reads it back."""
    return float(f"{value:.2f}")


def cache_config_info(text: str) -> dict[str, str]:
    """The labels of vLLM's cache_config_info gauge in a /metrics exposition ({} if absent)."""
    for family in text_string_to_metric_families(text):
        if family.name == CACHE_INFO and family.samples:
            return dict(family.samples[0].labels)
    return {}


def disagreements(plan: EnginePlan, facts: LogFacts,
                  info: dict[str, str] | None) -> dict[str, tuple[Any, Any]]:  # fmt: skip
    """Each figure the prediction and the engine state, where they differ: name -> (predicted,
    engine); `info` None leaves /metrics out. The engine's figures are what the log parser read
    from its `KV cache size` and geometry lines."""
    pairs = {
        "KV cache size tokens": (plan.tokens, facts.kv_cache_tokens),
        "maximum concurrency": (logged_concurrency(plan.max_concurrency), facts.max_concurrency),
        "concurrency for tokens": (plan.max_model_len, facts.max_concurrency_tokens),
        "geometry": (plan.geometry.line(), facts.kv_geometry and facts.kv_geometry.line()),
    }  # fmt: skip
    if info is not None:
        pairs[f"{CACHE_INFO} num_gpu_blocks"] = (str(plan.num_blocks), info.get("num_gpu_blocks"))
    return {name: pair for name, pair in pairs.items() if pair[0] != pair[1]}


def capacity_check(label: Label, predict: Callable[[Plan], StartPrediction], plan: Plan,
                   facts: LogFacts, server: Server) -> Check:  # fmt: skip
    if facts.starts == 0 or facts.last_start_failed:
        return skipped(label, "the log shows no started engine to compare (pass --service NAME "
                       "for one replica)")  # fmt: skip
    try:
        predicted = predict(plan)
    except (NotPredicted, UsageError) as why:
        return skipped(label, f"not predicted: {why}")
    figures = predicted.plan
    if isinstance(figures, Refused):
        return result(label, f"a refused start: {figures.why[:200]}", "the engine started",
                      False)  # fmt: skip
    try:
        info = cache_config_info(metrics_text(server))
    except CheckFailed as err:
        info = {"num_gpu_blocks": f"unread ({err})"}
    expected = (f"{figures.tokens:,} tokens, {figures.num_blocks:,} blocks, "
                f"{figures.max_concurrency:.2f}x (vLLM {predicted.answer.vllm} in the "
                "image)")  # fmt: skip
    wrong = disagreements(figures, facts, info)
    seen = "; ".join(f"{name}: predicted {a}, engine {b}" for name, (a, b) in wrong.items())
    return result(label, expected, seen or "the log's lines and /metrics as predicted", not wrong)

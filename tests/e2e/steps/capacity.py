"""`make capacity` against the real engine: the prediction (vLLM's engine core sizing in the
CPU image, on specs of the model built on the meta device) must equal what the started engine
logged and serves on /metrics, field by field; a second ask is answered from the cache; and the
configuration the engine refuses is refused by the prediction in the engine's own words."""

from __future__ import annotations

import json
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

from launch.loader import load
from smoke.log_facts import LogFacts
from smoke.logparse import parse_lines
from tests.e2e.harness import HOST_PORT, PROFILE, Run, Step, StepFailed, container, make
from tests.e2e.steps.faults import KV_DOES_NOT_FIT
from tests.e2e.steps.images import CUDA_PIN
from tests.e2e.steps.serving import SMOKE

LOG_PREFIX = "(EngineCore pid=1) INFO 12-03 12:00:00 [capacity.py:1] "
"""The prediction's engine lines are messages; the parser reads them as a log line carries
them (vLLM's own line format)."""


def predict(run: Run, *extra: str, env: dict[str, str] | None = None,
            profile: str = PROFILE) -> tuple[dict, float]:  # fmt: skip
    """`make capacity ... --json` as a user types it: its answer and how long it took."""
    start = time.monotonic()
    done = make(run, "capacity", f"PROFILE={profile}",
                f"CAPACITY_ARGS=--json {' '.join(extra)}".strip(), timeout=600,
                env={**run.env, **(env or {})})  # fmt: skip
    text = done.stdout[done.stdout.index("{"):]
    return json.loads(text), time.monotonic() - start


def facts_of(plan: dict) -> LogFacts:
    return parse_lines(LOG_PREFIX + line for line in plan["engine_lines"])


def cache_config_info() -> dict[str, str]:
    text = requests.get(f"http://127.0.0.1:{HOST_PORT}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            return dict(family.samples[0].labels)
    raise StepFailed("/metrics has no vllm:cache_config_info")


def predicted_as_started(run: Run) -> str:
    answer, cold = predict(run, "--no-cache")
    plan = answer["plans"][0]
    want = facts_of(plan)
    with (run.work / "server.log").open(encoding="utf-8") as fh:
        seen = parse_lines(fh)
    pairs = {
        "KV cache size tokens": (want.kv_cache_tokens, seen.kv_cache_tokens),
        "maximum concurrency": (want.max_concurrency, seen.max_concurrency),
        "concurrency at tokens": (want.max_concurrency_tokens, seen.max_concurrency_tokens),
        "geometry line": (want.kv_geometry and want.kv_geometry.to_json(),
                          seen.kv_geometry and seen.kv_geometry.to_json()),
    }  # fmt: skip
    info = cache_config_info()
    pairs["/metrics num_gpu_blocks"] = (str(plan["num_blocks"]), info.get("num_gpu_blocks"))
    wrong = {k: v for k, v in pairs.items() if v[0] != v[1] or v[0] is None}
    if wrong:
        raise StepFailed(f"prediction != engine (predicted, started): {wrong}")
    again, warm = predict(run)
    if not again["cached"] or again["plans"] != answer["plans"]:
        raise StepFailed(f"the second ask was not the cached answer: cached={again['cached']}")
    return (f"{plan['num_blocks']:,} blocks, {plan['tokens']:,} tokens, "
            f"{plan['max_concurrency']:.2f}x as the engine logged and /metrics reports; "
            f"cold {cold:.1f} s, cached {warm:.1f} s")  # fmt: skip


def refused_as_started(run: Run) -> str:
    """The configuration KV_DOES_NOT_FIT started (MAX_MODEL_LEN=1048576 on 1 GiB): the
    prediction must refuse it with the message the engine's log has."""
    done = make(run, "capacity", f"PROFILE={PROFILE}", "CAPACITY_ARGS=--json", timeout=600,
                check=False, env={**run.env, "MAX_MODEL_LEN": "1048576"})  # fmt: skip
    answer = json.loads(done.stdout[done.stdout.index("{"):])
    why = answer["plans"][0].get("refused")
    log = run.sh(["docker", "logs", container()], check=False).stdout
    if done.returncode == 0 or not why or why not in log:
        raise StepFailed(f"exit {done.returncode}, predicted {why!r}; the engine's log has no "
                         "such refusal")  # fmt: skip
    fix = [line for line in done.stderr.splitlines() if "KV_CACHE_MEMORY=" in line]
    if not fix or "MAX_MODEL_LEN=" not in fix[0]:
        raise StepFailed(f"no fix with numbers: {done.stderr[-300:]}")
    return f"refused as the engine did ({why[:80]}...); {fix[0][fix[0].index('Fix'):][:160]}"


def glm_in_cuda_image(run: Run) -> str:
    """Both GLM profiles in the CUDA image CI built (IMAGE_SOURCE=kit: its vLLM 0.33.0 with the
    patch series, on the CPU): mtp3 plans the split pages (the block and page sizes seed 004
    names, for the roles whose format the image shares with the qualified runtime); dflash is
    refused, naming what vLLM 0.33.0 lacks."""
    env = {"IMAGE": run.state.image("kit-id"), "IMAGE_SOURCE": "kit"}
    answer, secs = predict(run, "--budget", "12GiB", env=env, profile="mtp3-tp4-split")
    plan = answer["plans"][0]
    expect = load("mtp3-tp4-split").profile.expect
    geometry = plan["geometry"]
    shared = ("indexer", "recurrent")
    if answer["vllm"] != "0.33.0" or any(
        geometry["block_sizes"].get(r) != expect.block_sizes[r]
        or geometry["page_bytes"].get(r) != expect.page_bytes[r] for r in shared
    ) or geometry["block_sizes"].get("latent") != expect.block_sizes["latent"]:
        raise StepFailed(f"mtp3 in the CUDA image: vLLM {answer['vllm']}, blocks "
                         f"{geometry['block_sizes']}, pages {geometry['page_bytes']}")  # fmt: skip
    done = make(run, "capacity", "PROFILE=dflash-tp4-dcp4", timeout=600, check=False,
                env={**run.env, **env})  # fmt: skip
    said = done.stderr + done.stdout
    if done.returncode == 0 or "DFlash draft under decode context parallel 4" not in said:
        raise StepFailed(f"dflash: exit {done.returncode}: {said[-400:]}")
    return (f"mtp3: {plan['num_blocks']:,} blocks, {plan['tokens']:,} tokens at 12 GiB, pages "
            f"{geometry['page_bytes']} ({secs:.0f} s cold); dflash refused: vLLM 0.33.0 cannot "
            "build the replicated DFlash draft under DCP 4")  # fmt: skip


PREDICTED = Step("make capacity equals the started engine (log, geometry, /metrics)",
                 predicted_as_started, (SMOKE,))  # fmt: skip
REFUSED = Step("make capacity refuses what the engine refused, in its words",
               refused_as_started, (KV_DOES_NOT_FIT,))  # fmt: skip
CUDA_CAPACITY = Step("make capacity of both GLM profiles in the CUDA image", glm_in_cuda_image,
                     (CUDA_PIN,))  # fmt: skip

"""`make capacity` and `make up`'s prediction against the real engine: the prediction (vLLM's
engine core sizing in the CPU image, on specs of the model built on the meta device) must equal
what the started engine logged and serves on /metrics, field by field, at the profile's budget
and at a second budget and context set in compose/.env; a second ask is answered from the cache;
the configuration the engine refuses is refused by `make capacity` in the engine's own words and
by `make up` before any container exists, and the fix it names starts and passes `make smoke`."""

from __future__ import annotations

import json
import re
import time

import requests

from capacity.answer import EnginePlan, plan_from_json
from launch.glm53 import RUNTIME_TARGET_BLOCK
from launch.loader import load
from launch.vllm_vocab import VLLM_VERSION
from smoke.capacity_check import cache_config_info, disagreements
from smoke.logparse import parse_lines
from tests.e2e.harness import (
    HOST_PORT,
    PROFILE,
    Run,
    Step,
    StepFailed,
    compose_down,
    container,
    make,
    read_verdict,
    user_settings,
    wait_healthy,
)
from tests.e2e.steps.faults import KV_DOES_NOT_FIT
from tests.e2e.steps.images import CUDA_PIN
from tests.e2e.steps.serving import SMOKE
from tests.planner.figures import SM120_BLOCKS_AT_12_GIB

SECOND_BUDGET = 536_870_912
"""The second budget (512 MiB, half the profile's), set as KV_CACHE_MEMORY in compose/.env."""


def predict(run: Run, *extra: str, env: dict[str, str] | None = None, profile: str = PROFILE,
            check: bool = True) -> tuple[dict, float, str]:  # fmt: skip
    """`make capacity ... --json` as a user types it: its answer, how long it took, stderr."""
    start = time.monotonic()
    done = make(run, "capacity", f"PROFILE={profile}",
                f"CAPACITY_ARGS=--json {' '.join(extra)}".strip(), timeout=600, check=check,
                env={**run.env, **(env or {})})  # fmt: skip
    answer = json.loads(done.stdout[done.stdout.index("{"):])
    return answer, time.monotonic() - start, done.stderr


def engine_agrees(run: Run, plan: dict) -> None:
    """The prediction against the running engine: its log (kept in the work directory) and
    its /metrics."""
    log = run.sh(["docker", "logs", container()]).stdout
    metrics = requests.get(f"http://127.0.0.1:{HOST_PORT}/metrics", timeout=10).text
    planned = plan_from_json(plan)
    if not isinstance(planned, EnginePlan):
        raise StepFailed(f"the prediction refuses the start the engine made: {planned.why}")
    wrong = disagreements(planned, parse_lines(log.splitlines()), cache_config_info(metrics))
    if wrong:
        raise StepFailed(f"prediction != engine (predicted, started): {wrong}")


def volume_names(run: Run) -> set[str]:
    return set(run.sh(["docker", "volume", "ls", "--quiet"]).stdout.split())


def predicted_as_started(run: Run) -> str:
    before = volume_names(run)
    answer, cold, _ = predict(run, "--no-cache")
    left = volume_names(run) - before
    if left:  # the image declares /cache and /hf: the container's anonymous volumes
        raise StepFailed(f"make capacity left {len(left)} volume(s) behind: {sorted(left)}")
    plan = answer["plans"][0]
    engine_agrees(run, plan)
    again, warm, _ = predict(run)
    if not again["cached"] or again["plans"] != answer["plans"]:
        raise StepFailed(f"the second ask was not the cached answer: cached={again['cached']}")
    return (f"{plan['num_blocks']:,} blocks, {plan['tokens']:,} tokens, "
            f"{plan['max_concurrency']:.2f}x as the engine logged and /metrics reports; "
            f"cold {cold:.1f} s, cached {warm:.1f} s")  # fmt: skip


def refused_as_started(run: Run) -> str:
    """The configuration KV_DOES_NOT_FIT started (MAX_MODEL_LEN=1048576 on 1 GiB): `make
    capacity` refuses it with the message the engine's log has, and both fixes."""
    answer, _, stderr = predict(run, env={"MAX_MODEL_LEN": "1048576"}, check=False)
    why = answer["plans"][0].get("refused")
    log = run.sh(["docker", "logs", container()], check=False).stdout
    if not why or why not in log:
        raise StepFailed(f"predicted {why!r}; the engine's log has no such refusal")
    fix = [line for line in stderr.splitlines() if "KV_CACHE_MEMORY=" in line]
    if not fix or "MAX_MODEL_LEN=" not in fix[0]:
        raise StepFailed(f"no fix with numbers: {stderr[-300:]}")
    return f"refused as the engine did ({why[:80]}...); {fix[0][fix[0].index('Fix'):][:160]}"


def project_containers(run: Run) -> list[str]:
    out = run.sh(["docker", "ps", "--all", "--filter", "label=com.docker.compose.project=glm53",
                  "--format", "{{.Names}}"]).stdout  # fmt: skip
    return out.split()


def up_refuses_then_the_fix_serves(run: Run) -> str:
    """compose/.env with a 512 MiB budget and a 1,048,576-token context: `make up` exits 2 with
    no container created and names MAX_MODEL_LEN=N; with that N the same `make up` starts,
    `make smoke` passes (its `log: capacity as predicted` among the checks), and the
    prediction equals the engine at this second budget and context."""
    compose_down(run)
    budget = f"KV_CACHE_MEMORY={SECOND_BUDGET}"
    with user_settings(budget, "MAX_MODEL_LEN=1048576"):
        done = make(run, "up", f"PROFILE={PROFILE}", check=False)
    left = project_containers(run)
    fix = re.search(r"MAX_MODEL_LEN=(\d+)", done.stderr)
    if done.returncode == 0 or left or fix is None:
        raise StepFailed(f"make up exited {done.returncode}, containers {left}: "
                         f"{done.stderr[-300:]}")  # fmt: skip
    length = fix.group(1)
    with user_settings(budget, f"MAX_MODEL_LEN={length}"):
        make(run, "up", f"PROFILE={PROFILE}")
        secs = wait_healthy(run, [container()])
        smoke = make(run, "smoke", f"PROFILE={PROFILE}", "SMOKE_ARGS=--json", check=False)
        answer, _, _ = predict(run)
    verdict = read_verdict(smoke.stdout, smoke.returncode)
    if verdict.exit_code != 0 or verdict.failed() or not verdict.passed("log.capacity"):
        raise StepFailed(f"smoke of the fixed configuration: {verdict.failed()} "
                         f"{verdict.checks.get('log.capacity')}")  # fmt: skip
    plan = answer["plans"][0]
    if plan["budget_bytes"] != SECOND_BUDGET or plan["max_model_len"] != int(length):
        raise StepFailed(f"make capacity planned {plan['budget_bytes']} / {plan['max_model_len']}")
    engine_agrees(run, plan)
    seen = verdict.checks["log.capacity"]["seen"][:60]
    return (f"refused with no container, fix MAX_MODEL_LEN={length}; that start healthy after "
            f"{secs:.0f} s, smoke passed with '{seen}'; "
            f"{plan['num_blocks']:,} blocks, {plan['tokens']:,} tokens as the engine "
            "has")  # fmt: skip


def glm_in_cuda_image(run: Run) -> str:
    """Both GLM profiles in the CUDA image CI built (IMAGE_SOURCE=kit: its vLLM 0.34.0 with the
    patch series, on the CPU): mtp3 plans the split pages (every block and page size seed 004
    names: vLLM 0.34.0's SM120 latent row is the runtime's); dflash, whose target block vLLM
    aligns on the GPU, is refused naming the block to give, and with that block plans the
    DFlash2 draft's replicated layers at the profile's draft block, the pool vLLM's SM120
    latent gives (905 blocks at 12 GiB; the runtime's B12X backend gets seed 000's 906)."""
    env = {"IMAGE": run.state.image("kit-id"), "IMAGE_SOURCE": "kit"}
    answer, secs, _ = predict(run, "--budget", "12GiB", env=env, profile="mtp3-tp4-split")
    plan = answer["plans"][0]
    expect = load("mtp3-tp4-split").profile.expect
    geometry = plan["geometry"]
    if answer["vllm"] != VLLM_VERSION or any(
        geometry["block_sizes"].get(r) != expect.block_sizes[r]
        or geometry["page_bytes"].get(r) != expect.page_bytes[r] for r in expect.page_bytes
    ):
        raise StepFailed(f"mtp3 in the CUDA image: vLLM {answer['vllm']}, blocks "
                         f"{geometry['block_sizes']}, pages {geometry['page_bytes']}")  # fmt: skip
    done = make(run, "capacity", "PROFILE=dflash-tp4-dcp4", timeout=600, check=False,
                env={**run.env, **env})  # fmt: skip
    said = done.stderr + done.stdout
    fix = f"VLLM_EXTRA_ARGS='--block-size {RUNTIME_TARGET_BLOCK}'"
    if done.returncode != 2 or fix not in said:
        raise StepFailed(f"dflash without a block: exit {done.returncode}: {said[-400:]}")
    named = {**env, "VLLM_EXTRA_ARGS": f"--block-size {RUNTIME_TARGET_BLOCK}"}
    dflash, dsecs, _ = predict(run, "--budget", "12GiB", env=named, profile="dflash-tp4-dcp4")
    drafted = dflash["plans"][0]
    draft = [g for g in drafted["geometry"]["groups"] if g["role"] == "draft"]
    wanted = load("dflash-tp4-dcp4").profile.expect.block_sizes["draft"]
    if (drafted["num_blocks"] != SM120_BLOCKS_AT_12_GIB
            or [(g["block_size"], g["cp_size"]) for g in draft] != [(wanted, 1)]):
        raise StepFailed(f"dflash in the CUDA image: {drafted['num_blocks']} blocks, draft "
                         f"groups {draft}")  # fmt: skip
    return (f"mtp3: {plan['num_blocks']:,} blocks, {plan['tokens']:,} tokens at 12 GiB, pages "
            f"{geometry['page_bytes']} ({secs:.0f} s cold); dflash: refused without a block "
            f"({fix}), with it {drafted['num_blocks']:,} blocks, {drafted['tokens']:,} "
            f"tokens, the draft's {draft[0]['layers']} layers replicated at {wanted} tokens "
            f"({dsecs:.0f} s cold)")  # fmt: skip


PREDICTED = Step("make capacity equals the started engine (log, geometry, /metrics)",
                 predicted_as_started, (SMOKE,))  # fmt: skip
REFUSED = Step("make capacity refuses what the engine refused, in its words",
               refused_as_started, (KV_DOES_NOT_FIT,))  # fmt: skip
UP_REFUSED = Step("make up refuses what cannot fit; the fix it names serves and passes smoke",
                  up_refuses_then_the_fix_serves, (REFUSED,))  # fmt: skip
CUDA_CAPACITY = Step("make capacity of both GLM profiles in the CUDA image", glm_in_cuda_image,
                     (CUDA_PIN,))  # fmt: skip

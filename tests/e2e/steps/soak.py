"""`make soak` on the real engine: `DURATION` of mixed load (short and long prompts, streamed and
whole, tool requests through vLLM's real GLM tool parser) at the profile's max_num_seqs, on the
server the access step left serving with its key (the route guard in every request's path).
No request may fail, and the container's resident memory (Docker Engine API) may grow no more
than `RSS_BOUND_MIB` from the end of the first minute to the end."""

from __future__ import annotations

import json

from launch.loader import load
from serving.soak import MIB
from tests.e2e.harness import PROFILE, Run, Step, StepFailed, container, make, wait_healthy
from tests.e2e.steps.access import EVERY_ROUTE

DURATION = "3m"
MAX_TOKENS = 64
"""Short answers, so three minutes on two cores finish hundreds of requests of every kind."""
RSS_BOUND_MIB = 256
"""The CPU server's bound: its API server and engine core hold a 1 GiB KV cache and a small
model; a leak of a few KiB per request shows as tens of MiB over hundreds of requests."""


def soak(run: Run) -> str:
    if run.state.api_key is None:
        raise StepFailed("no server with a key from the access step")
    wait_healthy(run, [container()])
    out = run.work / "soak.json"
    args = f"--max-tokens {MAX_TOKENS} --max-rss-growth-mib {RSS_BOUND_MIB} --out {out}"
    result = make(run, "soak", f"PROFILE={PROFILE}", f"DURATION={DURATION}",
                  f"SOAK_ARGS={args}", env={"VLLM_API_KEY": run.state.api_key},
                  check=False)  # fmt: skip
    if not out.exists():
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise StepFailed(f"make soak wrote no receipt (exit {result.returncode}): {tail}")
    receipt = json.loads(out.read_text())["soak"]
    lines, verdict = receipt["lines"], receipt["verdict"]
    slots = load(PROFILE).profile.engine.max_num_seqs
    sent = {kind: sum(line["by_kind"].get(kind, 0) for line in lines)
            for kind in sorted(set(receipt["mix"]))}  # fmt: skip
    growth = verdict["rss_growth_bytes"]
    kv_usage = [None if line["kv_usage"] is None else round(line["kv_usage"], 3) for line in lines]
    shown = (f"{verdict['requests']} requests {sent} at {slots} in flight, "
             f"{verdict['failed']} failed; per minute "
             f"{[line['requests'] for line in lines]} requests, "
             f"{[round(line['output_tok_s']) for line in lines]} tok/s, KV usage "
             f"{kv_usage}, preempted "
             f"{[line['preemptions'] for line in lines]}; RSS "
             f"{lines[0]['rss_bytes'] / MIB:.0f} MiB after the first minute, "
             f"{'?' if growth is None else f'{growth / MIB:+.1f}'} MiB by the end "
             f"(bound {RSS_BOUND_MIB} MiB; {receipt['rss_source']})")  # fmt: skip
    if result.returncode != 0 or not verdict["passed"]:
        raise StepFailed(f"make soak exited {result.returncode}: {verdict['problems']}: {shown}")
    if not receipt["rss_source"].startswith("resident memory of container"):
        raise StepFailed(f"the soak did not read the container's memory: {shown}")
    if len(lines) != 3 or not all(line["requests"] for line in lines):
        raise StepFailed(f"not three minutes of finished requests: {shown}")
    if len(sent) != 6 or not all(sent.values()):
        raise StepFailed(f"not every kind of request was served: {shown}")
    return shown


SOAK = Step(f"make soak DURATION={DURATION}: mixed load, no failure, RSS bounded", soak,
            (EVERY_ROUTE,))  # fmt: skip

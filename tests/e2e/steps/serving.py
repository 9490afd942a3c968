"""The served CPU profile as users run it: plain `docker compose up -d` pulls the pinned digest,
the healthcheck turns healthy, the processes run unprivileged, `make smoke` passes every check on
the real engine (vLLM's GLM parsers and counters, the kit's geometry plugin), `make fetch`
fills the weights volume, and two replicas serve behind vLLM's router."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from launch.loader import load
from smoke.log_checks import log_checks
from smoke.logparse import parse_lines
from tests.e2e.harness import (
    HOST_PORT,
    PROFILE,
    Run,
    Step,
    StepFailed,
    chat,
    container,
    image_present,
    make,
    read_verdict,
    served_requests,
    serving,
    wait_answering,
    wait_healthy,
)
from tests.e2e.steps.images import PIN, REMOVE_LOCAL

REAL_ENGINE_CHECKS = ("reasoning", "tool", "tool-stream", "tool-noargs", "tool-noargs-stream",
                      "no-tools-stream", "reasoning-tool", "prefix", "structured", "concurrent")
"""Request checks (by key) that must pass on the real CPU engine: vLLM's own glm45/glm47 parsers
on the model's GLM-format output, the edge cases GLM users reported among them, prefix reuse
from the engine's counters."""
GEOMETRY_CHECKS = ("log.kv-tokens", "log.kv-blocks", "log.block-sizes", "log.page-bytes",
                   "log.layers", "log.agrees.kv-cache-tokens")  # fmt: skip
"""Log checks (by key) the smoke must make of the real CPU engine's geometry (the plugin's
line), cross-checked with vLLM's own KV cache size line."""
WRITE_PROBE = (
    "import os\n"
    "for d in ('/cache', '/hf'):\n"
    "    p = os.path.join(d, '.kit-e2e-write'); open(p, 'w').write('x'); os.remove(p)\n"
    "print(os.getuid(), os.getgid())\n"
)


def compose_up(run: Run) -> str:
    serving(run)
    ref = run.state.image("cpu-pinned")
    if not image_present(run, ref):
        raise StepFailed("the image was not pulled by digest")
    return f"`docker compose up -d` in compose/ pulled {ref.split('@')[1][:19]}"


def healthy(run: Run) -> str:
    return f"healthcheck healthy after {wait_healthy(run, [container()]):.0f} s"


def non_root(run: Run) -> str:
    """The server's processes run unprivileged, and the cache and weights volumes compose made
    are writable for them."""
    name = container()
    uid, gid = run.sh(["docker", "exec", name, "python3", "-c", WRITE_PROBE]).stdout.split()
    server = run.sh(["docker", "exec", name, "python3", "-c",
                     "import os; print(sorted({os.stat(f'/proc/{p}').st_uid for p in os.listdir("
                     "'/proc') if p.isdigit()}))"]).stdout.strip()  # fmt: skip
    restart = run.sh(["docker", "inspect", "--format", "{{.HostConfig.RestartPolicy.Name}}",
                      name]).stdout.strip()  # fmt: skip
    if uid == "0" or server != "[1000]":
        raise StepFailed(f"uid {uid}, the container's processes run as {server}")
    if restart != "unless-stopped":
        raise StepFailed(f"restart policy {restart!r}")
    return (f"uid {uid} gid {gid} (every process: {server}) writes /cache and /hf; "
            f"restart policy {restart}")


SHM_PROBE = """\
import os, sys
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

def shm():
    st = os.statvfs("/dev/shm")
    return st.f_frsize * st.f_blocks, st.f_frsize * (st.f_blocks - st.f_bfree)

size, used_before = shm()
tier, page = int(sys.argv[1]), 1 << 20
region = SharedOffloadRegion("kit-e2e-tier", tier // page, 0, page, page, lambda: None,
                             populate_only_on_creator=True)
print(size, shm()[1] - used_before)
region.cleanup()
try:
    SharedOffloadRegion("kit-e2e-too-big", 2 * size // page, 0, page, page, lambda: None,
                        populate_only_on_creator=True)
    print("created")
except RuntimeError as err:
    print(str(err).splitlines()[0])
"""
"""Inside the running server: /dev/shm's size, then vLLM's own SharedOffloadRegion (the class
the native KV tier maps its /dev/shm region with: `Created mmap file`) maps and pre-faults a
tier of argv[1] bytes; the bytes it filled are printed. A region twice /dev/shm's size must get
vLLM's own refusal (check_shm_free_space). The CPU build refuses the native tier at start (GPU
only), so the region is created here by the class itself, in the server's own container."""
SHM_TIER_BYTES = 1 << 30
"""A 1 GiB tier (`KV_OFFLOADING_SIZE_GB=1`), sixteen times Docker's 64 MB default /dev/shm."""


def private_shm(run: Run) -> str:
    """The container runs in a private IPC namespace with a /dev/shm of the profile's size
    (not the host's /dev/shm, which `ipc: host` would mount while ignoring shm_size), and a
    native KV tier larger than Docker's 64 MB default gets its region there."""
    name = container()
    want = load(PROFILE).profile.deployment.shm_size_gib * 2**30
    ipc = run.sh(["docker", "inspect", "--format", "{{.HostConfig.IpcMode}}", name]).stdout.strip()
    out = run.sh(["docker", "exec", name, "python3", "-c", SHM_PROBE,
                  str(SHM_TIER_BYTES)]).stdout.strip().splitlines()  # fmt: skip
    size, filled = (int(x) for x in out[0].split())
    host = os.statvfs("/dev/shm")
    if ipc == "host" or size != want:
        raise StepFailed(f"IpcMode {ipc!r}, /dev/shm {size} bytes in the container (the profile's "
                         f"{want}; the host's {host.f_frsize * host.f_blocks})")  # fmt: skip
    if filled < SHM_TIER_BYTES:
        raise StepFailed(f"vLLM's region of {SHM_TIER_BYTES} bytes filled only {filled} of "
                         "/dev/shm")  # fmt: skip
    if not out[1].startswith("Insufficient space in /dev/shm"):
        raise StepFailed(f"a region twice /dev/shm's size was not refused by vLLM: {out[1]}")
    return (f"IpcMode {ipc}, /dev/shm {size / 2**30:.0f} GiB = deployment.shm_size_gib (the "
            f"host's is {host.f_frsize * host.f_blocks / 2**30:.0f} GiB); vLLM's "
            f"SharedOffloadRegion filled a {SHM_TIER_BYTES / 2**30:.0f} GiB tier; twice the size: "
            f"{out[1][:90]}")


def smoke(run: Run) -> str:
    """`make smoke` as users type it, its verdict read as JSON, checks by key."""
    done = make(run, "smoke", f"PROFILE={PROFILE}", "SMOKE_ARGS=--json", check=False)
    verdict = read_verdict(done.stdout, done.returncode)
    ran = [c for c in verdict.checks.values() if not c["skipped"]]
    table = f"{len(ran) - len(verdict.failed())} passed, {len(verdict.failed())} failed, " \
        f"{len(verdict.checks) - len(ran)} skipped"
    if verdict.exit_code != 0 or verdict.failed():
        raise StepFailed(f"{table}: {[(c['key'], c['seen'][:80]) for c in verdict.failed()]}")
    for key in (*REAL_ENGINE_CHECKS, *GEOMETRY_CHECKS):
        if not verdict.passed(key):
            raise StepFailed(f"{key} did not pass (or did not run): {verdict.checks.get(key)}")
    log = run.sh(["docker", "logs", container()]).stdout
    (run.work / "server.log").write_text(log, encoding="utf-8")
    return f"{table} (read by key; {real_engine_geometry(run)})"


def real_engine_geometry(run: Run) -> str:
    """The geometry plugin's line in the real engine's container log, checked against cpu-tiny's
    expectations; one expectation changed fails exactly its own check."""
    with (run.work / "server.log").open(encoding="utf-8") as fh:
        facts = parse_lines(fh)
    if facts.kv_geometry is None:
        raise StepFailed(f"no geometry line in the container log: {facts.geometry_missing}")
    profile = load(PROFILE).profile
    wrong = {role: page * 2 for role, page in (profile.expect.page_bytes or {}).items()}
    changed = dataclasses.replace(profile, expect=dataclasses.replace(profile.expect,
                                                                      page_bytes=wrong))
    failed = [c.key for c in log_checks(changed, facts) if not c.ok and not c.skipped]
    if failed != ["log.page-bytes"]:
        raise StepFailed(f"page bytes {wrong} made {failed} fail, not exactly log.page-bytes")
    g = facts.kv_geometry
    return (f"plugin: {g.num_blocks} blocks of {g.block_sizes} tokens, pages "
            f"{g.page_bytes}, layers {g.layers}; page bytes {wrong} fails log.page-bytes")


def replicas(run: Run) -> str:
    serving(run, replicas=2)
    names = [container(0), container(1)]
    wait_healthy(run, names)
    router = f"http://127.0.0.1:{HOST_PORT}"
    # the router starts once both replicas are healthy
    wait_answering(f"{router}/health", "the router", 60)
    # cache-aware routing keeps a prompt on the replica holding its prefix and sends new ones to
    # the least loaded, so it takes concurrent requests with nothing in common to reach both
    prompts = [chr(ord("a") + i) * 60 for i in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda text: chat(router, text, 64, ignore_eos=True), prompts))
    served = [served_requests(HOST_PORT + 1 + i) for i in range(2)]
    if not all(served):
        raise StepFailed(f"requests per replica {served}: the router did not spread them")
    # `make top` finds every replica from compose/.env, a line each
    topped = make(run, "top", f"PROFILE={PROFILE}",
                  "TOP_ARGS=--once --json --interval 1").stdout.splitlines()
    watched = sorted(json.loads(line)["server"] for line in topped if line.startswith("{"))
    if watched != ["vllm-0", "vllm-1"]:
        raise StepFailed(f"make top watched {watched}, not both replicas: {topped[-2:]}")
    run.sh(["docker", "kill", names[0]])
    deadline = time.monotonic() + 60
    ok = 0
    while ok < 8:
        try:
            ok = ok + 1 if chat(router, "Reply with exactly READY") == "READY" else 0
        except requests.RequestException:
            ok = 0
        if time.monotonic() > deadline:
            raise StepFailed("the endpoint did not keep answering after a replica was killed")
    return (f"requests per replica {[int(s) for s in served]}; make top watched {watched}; "
            f"after {names[0]} was killed, 8 consecutive answers through the router")


COMPOSE_UP = Step("docker compose up pulls by digest", compose_up, (REMOVE_LOCAL,))
HEALTHY = Step("healthcheck turns healthy", healthy, (COMPOSE_UP,))
NON_ROOT = Step("the server runs unprivileged, volumes writable, restarts", non_root, (HEALTHY,))
PRIVATE_SHM = Step("private /dev/shm of the profile's size holds a native tier", private_shm,
                   (HEALTHY,))  # fmt: skip
SMOKE = Step("make smoke passes every check", smoke, (HEALTHY,))
REPLICAS = Step("two replicas behind vllm-router", replicas, (PIN,))

"""`make e2e`: the whole user path on a real Docker engine and a real vLLM engine, no GPU.

Each step runs what a user types (make targets, plain `docker compose` in compose/) against the
kit's CPU image and profile `cpu-tiny`, and prints one line; the run ends with
`N passed, M failed` and exits 1 if any step failed. A step whose prerequisite failed is counted
as failed, not skipped. What it needs: a Docker engine with the compose plugin, `mmdebstrap`, and
a registry on 127.0.0.1 (`E2E_REGISTRY`, default 127.0.0.1:5000); `.ci/run` starts the engine and
the registry (tests/e2e/services.py).

It pins into a copy of compose/images.lock (KIT_IMAGES_LOCK), so the tracked lock is never
rewritten, and moves an existing compose/.env aside for the run and puts it back afterwards.
Everything it starts is stopped at the end (`docker compose down --volumes`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from launch.compose_env import ENV_PATH  # noqa: E402
from launch.docker_api import bridge_address, connect  # noqa: E402
from launch.image_lock import COMPOSE_DIR, LOCK_PATH, read_lock  # noqa: E402
from launch.loader import load  # noqa: E402
from smoke.bench.metrics import parse_counter  # noqa: E402
from smoke.logparse import parse_lines  # noqa: E402
from smoke.verdict import geometry_checks  # noqa: E402
from tests.bench_client import VLLM_BENCH  # noqa: E402
from tests.hub_standin import HubRepo, HubStandin  # noqa: E402

PROFILE = "cpu-tiny"
PROJECT = "glm53"
REGISTRY = os.environ.get("E2E_REGISTRY", "127.0.0.1:5000")
HOST_PORT = 8000
HEALTHY_WITHIN_S = 300
AGREEMENT = 0.10
"""The bench's decode and prefill figures must agree with `vllm bench serve`'s within 10%."""
DECODE_CONCURRENCY = 4
DECODE_TOKENS = 128
DECODE_PAIRS = 7
"""vLLM decode runs, each between two kit runs (kit, vLLM, kit, vLLM, ..., kit); each vLLM run is
compared with the mean of the two kit runs around it, the median of those ratios must be within
`AGREEMENT`, and each kit run must equal the server's own generated-token counter over its
window. The server's own speed moves on two cores: its counter moved 382 -> 301 tok/s over five
runs in one e2e run, and vLLM's TPOT 10.6 -> 14.5 ms; with alternating pairs the client that ran
second in a pair read the slower server (ratios [1.04, 1.04, 1.10, 1.30, 1.11], median 1.100).
A kit run on either side cancels a steady drift; the speed also jumps (vLLM's TPOT 15.4, 13.1,
11.7, 13.0, 16.2 ms in five runs of another e2e run, bracketed ratios [1.03, 0.94, 0.92, 1.01,
1.27]), so the median is taken over seven. Giving the clients their own core (container on
core 0, clients on core 1) did not narrow the spread: the clients' own CPU time is not what
moves it. The CPU profile's model is built so that a decode step is compute-bound
(docker/tiny_model.py): with a 2 ms overhead-bound step, the server's speed moved by tens of
percent between back-to-back runs of the same client."""
DECODE_PROMPTS = DECODE_CONCURRENCY * 6
PREFILL_TOKENS = 2048
PREFILL_PAIRS = 3
PREFILL_PER_RUN = 2
"""Prefill TTFT: kit and vLLM runs alternate PREFILL_PAIRS times, PREFILL_PER_RUN prompts each,
after one untimed prompt of the same length, while a busy loop holds one of the two cores; the
medians of all the kit's and all of vLLM's completed requests are compared. A median of vLLM's
three prompts at the end of the run once compared a cold first request (5.8 s) and a warm one
(3.0 s) with the kit's warm ones (3.05 s), one of its three having failed: 30% apart although
both clients measured the same server."""
REUSE_TOKENS = 1024
HF_CACHE_VOLUME = "glm53-e2e-hf-cache"
"""The weights volume of the run (compose's HF_CACHE_VOLUME), so a machine's own weights volume
is neither read nor removed by `down --volumes`."""
REAL_ENGINE_CHECKS = ("api: tool call without arguments",
                      "api: streamed tool call without arguments",
                      "api: streamed answer without tools", "api: reasoning then tool call",
                      "api: prefix cache reuse")  # fmt: skip
"""The checks of what GLM users reported broken, run on the real CPU engine with vLLM's own
glm45/glm47 parsers and its prefix-cache counters."""
GEOMETRY_CHECKS = ("log: KV blocks", "log: block sizes", "log: page bytes", "log: layers",
                   "log: geometry agrees with vLLM (KV cache tokens)")  # fmt: skip
"""What the smoke must check of the real CPU engine's geometry (the plugin's line)."""
CUDA_TAG = "glm53-kit:e2e"
CUDA_MAX_BYTES = 12_000_000_000
"""The CUDA image's uncompressed size must stay within 12 GB (an nvidia/cuda devel base alone
adds about 8 GB to the same environment)."""
GLM_PROFILES = ("mtp3-tp4-split", "dflash-tp4-dcp4")
HUB_REPO = "kit-e2e/tiny-weights"
HUB_COMMIT = "5d1f0c8a2b7e4f9061c3d2a8b5e7f1029384abcd"


class StepFailed(Exception):
    """A step's own failure; the message is the line the run prints."""


@dataclass
class Run:
    work: Path
    env: dict[str, str]
    results: list[tuple[str, bool, str, float]] = field(default_factory=list)
    state: dict[str, str] = field(default_factory=dict)

    def sh(
        self,
        argv: list[str],
        *,
        cwd: Path = REPO,
        timeout: float = 900,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command, keep its output in the work directory, fail the step on error."""
        result = subprocess.run(
            argv,
            cwd=cwd,
            env={**self.env, **(env or {})},
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        log = self.work / "commands.log"
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(argv)}  (cwd {cwd}, exit {result.returncode})\n")
            fh.write(result.stdout + result.stderr + "\n")
        if check and result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
            raise StepFailed(
                f"`{' '.join(argv[:4])}` exited {result.returncode}: {' | '.join(tail)}"
            )
        return result

    def step(self, name: str, body: Callable[[], str], needs: tuple[str, ...] = ()) -> bool:
        start = time.monotonic()
        missing = [n for n in needs if not self.passed(n)]
        if missing:
            ok, detail = False, f"not run: needs {', '.join(missing)}"
        else:
            try:
                ok, detail = True, body()
            except StepFailed as err:
                ok, detail = False, str(err)
            except (subprocess.TimeoutExpired, requests.RequestException, OSError) as err:
                ok, detail = False, f"{type(err).__name__}: {err}"
            except Exception as err:  # a defect in the step itself still ends in its FAIL line
                ok, detail = False, f"step crashed: {type(err).__name__}: {err}"
        secs = time.monotonic() - start
        self.results.append((name, ok, detail, secs))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail} ({secs:.0f} s)", flush=True)
        return ok

    def passed(self, name: str) -> bool:
        return any(n == name and ok for n, ok, _, _ in self.results)


def compose(run: Run, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Plain `docker compose ...` in compose/, as users type it (it reads compose/.env)."""
    return run.sh(["docker", "compose", *args], cwd=COMPOSE_DIR, timeout=timeout)


def compose_down(run: Run) -> None:
    """`docker compose down` of whatever compose/.env runs (nothing before the first configure)."""
    if ENV_PATH.exists():
        compose(run, "down")


def make(run: Run, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return run.sh(["make", "--no-print-directory", *args], timeout=timeout)


def container_state(run: Run, name: str) -> dict:
    out = run.sh(["docker", "inspect", "--format", "{{json .State}}", name], check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def wait_healthy(run: Run, names: list[str], within: float = HEALTHY_WITHIN_S) -> float:
    start = time.monotonic()
    while True:
        states = {n: container_state(run, n) for n in names}
        health = {n: (s.get("Health") or {}).get("Status") for n, s in states.items()}
        if all(h == "healthy" for h in health.values()):
            return time.monotonic() - start
        dead = [n for n, s in states.items() if s and not s.get("Running")]
        if dead:
            raise StepFailed(f"{dead[0]} exited with code {states[dead[0]].get('ExitCode')}")
        if time.monotonic() - start > within:
            raise StepFailed(f"not healthy within {within:.0f} s: {health}")
        time.sleep(2)


def project_containers(run: Run) -> list[str]:
    out = run.sh(
        [
            "docker",
            "ps",
            "--all",
            "--quiet",
            "--filter",
            f"label=com.docker.compose.project={PROJECT}",
        ]
    )
    return out.stdout.split()


def chat(
    url: str, prompt: str, max_tokens: int = 16, *, ignore_eos: bool = False, timeout: float = 30
) -> str:
    r = requests.post(
        f"{url}/v1/chat/completions",
        timeout=timeout,
        json={
            "model": "kit-tiny-chat",
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "ignore_eos": ignore_eos,
        },
    )
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def served_requests(port: int) -> float:
    """`vllm:request_success_total` of one replica, summed over finish reasons."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return parse_counter(text, "vllm:request_success_total") or 0.0


# ---- the steps ------------------------------------------------------------------------------


def volumes(run: Run) -> set[str]:
    return set(run.sh(["docker", "volume", "ls", "--quiet"]).stdout.split())


def step_engine(run: Run) -> str:
    run.state["volumes"] = " ".join(sorted(volumes(run)))
    server = run.sh(["docker", "version", "--format", "{{.Server.Version}}"]).stdout.strip()
    plugin = run.sh(["docker", "compose", "version", "--short"]).stdout.strip()
    requests.get(f"http://{REGISTRY}/v2/", timeout=5).raise_for_status()
    return f"Docker engine {server}, compose {plugin}, registry {REGISTRY}"


def step_base(run: Run) -> str:
    tag = f"{REGISTRY}/glm53/debian:bookworm"
    run.sh([sys.executable, "docker/debian_base.py", "--tag", tag, "--push"], timeout=600)
    run.state["cpu_base"] = tag
    make(run, "pin", f"IMAGE={tag}", "SOURCE=cpu-base")
    return read_lock(Path(run.env["KIT_IMAGES_LOCK"]))["CPU_BASE_IMAGE"]


def step_build(run: Run) -> str:
    tag = f"{REGISTRY}/glm53/kit-cpu:e2e"
    make(run, "build-cpu", f"TAG={tag}", "BUILD_ARGS=--trust-host-ca --allow-dirty", timeout=1800)
    labels = json.loads(
        run.sh(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag]).stdout
    )
    run.state["tag"] = tag
    return (
        f"{tag}, engine label {labels['io.glm53-kit.engine']}, source lock "
        f"{labels['io.glm53-kit.source-lock.sha256'][:12]}"
    )


HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
"""Where the host's extra CAs are, which docker/build.py --trust-host-ca serves to a build."""
INPUT_MARKS = (".whl", "build-inputs", "usr/local/share/ca-certificates/")
"""Paths a per-build input would leave in a layer: a wheel, the old inputs directory, a trusted
extra certificate."""
DEBIAN_WHEELS = "usr/share/python-wheels/"
"""Debian's own pip and setuptools wheels (python3-pip-whl, for ensurepip): not build inputs."""


def host_ca_bodies() -> list[bytes]:
    """One base64 line of each of the host's extra CA certificates (what a test build trusts)."""
    bodies = []
    for crt in sorted(HOST_CA_DIR.glob("*.crt")):
        lines = crt.read_bytes().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith(b"-----BEGIN"))
        bodies.append(lines[start + 2])  # past the first line, which every RSA key shares
    return bodies


def layer_entries(fileobj: IO[bytes] | None) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """The entries of one layer tar as it streams; nothing for a blob that is not a tar."""
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as layer:
            for entry in layer:
                yield layer, entry
    except tarfile.ReadError:
        return


def build_inputs_in_layers(run: Run, tag: str) -> str:
    """Every layer of `docker save TAG`, read as it streams: no wheel, no inputs directory, no
    extra certificate file, and no host CA in any CA bundle. Returns what was read."""
    bodies = host_ca_bodies()
    proc = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
    found, layers, files = [], 0, 0
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as image:
        for member in image:
            if not member.isfile() or member.name.endswith((".json", "repositories", "oci-layout")):
                continue
            seen = 0
            for layer, entry in layer_entries(image.extractfile(member)):
                seen += 1
                name = entry.name
                if (any(mark in name for mark in INPUT_MARKS) and entry.isfile()
                        and DEBIAN_WHEELS not in name):  # fmt: skip
                    found.append(name)
                elif name.endswith("ca-certificates.crt") and entry.isfile():
                    bundle = layer.extractfile(entry).read()
                    found += [f"{name} holds a host CA" for b in bodies if b in bundle]
            layers, files = layers + bool(seen), files + seen
    if proc.wait() != 0:
        raise StepFailed(f"docker save {tag} exited {proc.returncode}")
    if found:
        raise StepFailed(f"build inputs in the layers of {tag}: {found[:5]}")
    return (f"{layers} layers, {files} files: no wheel, no build-inputs, no extra certificate; "
            f"none of the host's {len(bodies)} CA(s) in a bundle")


def step_layers(run: Run) -> str:
    return build_inputs_in_layers(run, run.state["tag"])


def step_cuda_layers(run: Run) -> str:
    return build_inputs_in_layers(run, CUDA_TAG)


def step_push(run: Run) -> str:
    out = run.sh(["docker", "push", run.state["tag"]], timeout=900).stdout
    match = re.search(r"digest: (sha256:[0-9a-f]{64})", out)
    if match is None:
        raise StepFailed(f"docker push printed no digest: {out[-200:]!r}")
    run.state["digest"] = match.group(1)
    return f"pushed, registry digest {match.group(1)}"


def step_pin(run: Run) -> str:
    make(run, "pin", f"IMAGE={run.state['tag']}", "SOURCE=cpu")
    pinned = read_lock(Path(run.env["KIT_IMAGES_LOCK"]))["CPU_IMAGE"]
    want = f"{REGISTRY}/glm53/kit-cpu@{run.state['digest']}"
    if pinned != want:
        raise StepFailed(f"lock has {pinned}, the registry said {want}")
    run.state["ref"] = pinned
    return f"CPU_IMAGE={pinned}"


def step_remove_local(run: Run) -> str:
    run.sh(["docker", "image", "rm", run.state["tag"]])
    if run.sh(["docker", "image", "inspect", run.state["ref"]], check=False).returncode == 0:
        run.sh(["docker", "image", "rm", run.state["ref"]])
    if run.sh(["docker", "image", "inspect", run.state["ref"]], check=False).returncode == 0:
        raise StepFailed(f"{run.state['ref']} is still present locally")
    return "local copy removed; compose must pull it"


def step_compose_up(run: Run) -> str:
    make(run, "configure", f"PROFILE={PROFILE}")
    compose(run, "up", "--detach")
    if run.sh(["docker", "image", "inspect", run.state["ref"]], check=False).returncode != 0:
        raise StepFailed("the image was not pulled by digest")
    return f"`docker compose up -d` in compose/ pulled {run.state['ref'].split('@')[1][:19]}"


def step_healthy(run: Run) -> str:
    secs = wait_healthy(run, [f"{PROJECT}-vllm-1"])
    return f"healthcheck healthy after {secs:.0f} s"


WRITE_PROBE = (
    "import os\n"
    "for d in ('/cache', '/hf'):\n"
    "    p = os.path.join(d, '.kit-e2e-write'); open(p, 'w').write('x'); os.remove(p)\n"
    "print(os.getuid(), os.getgid())\n"
)


def step_non_root(run: Run) -> str:
    """The server's processes run unprivileged, and the cache and weights volumes compose made
    are writable for them."""
    name = f"{PROJECT}-vllm-1"
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


def step_smoke(run: Run) -> str:
    # no LOG: the check reads the service's container through the Docker Engine API
    out = make(run, "smoke", f"PROFILE={PROFILE}").stdout
    summary = out.strip().splitlines()[-1]
    if not re.fullmatch(r"\d+ passed, 0 failed(, \d+ skipped)?", summary):
        raise StepFailed(summary)
    if "log: KV cache tokens" not in out:
        raise StepFailed("the log checks did not run")
    # vLLM's own glm45 / glm47 parsers on the model's GLM-format output, the edge cases GLM
    # users reported among them, and prefix reuse read from the real engine's counters
    passed = {line.split("  ")[0] for line in out.splitlines() if line.endswith("  pass")}
    for name in ("api: reasoning separated", "api: tool call", "api: streamed tool call",
                 *REAL_ENGINE_CHECKS, "api: structured output",
                 "api: 8 concurrent answers"):  # fmt: skip
        if name not in passed:
            raise StepFailed(f"{name!r} did not pass (or did not run)")
    (run.work / "server.log").write_text(
        run.sh(["docker", "logs", f"{PROJECT}-vllm-1"]).stdout, encoding="utf-8"
    )
    geometry = real_engine_geometry(run, out)
    return summary + (" (API checks with vLLM's GLM reasoning and tool parsers, and log checks "
                      f"read from the container; {geometry})")


def real_engine_geometry(run: Run, smoke_out: str) -> str:
    """The geometry plugin's line in the real engine's container log, checked by the smoke
    against cpu-tiny's expectations; one expectation changed fails exactly its own check."""
    with (run.work / "server.log").open(encoding="utf-8") as fh:
        facts = parse_lines(fh)
    if facts.kv_geometry is None:
        raise StepFailed(f"no geometry line in the container log: {facts.geometry_missing}")
    for name in GEOMETRY_CHECKS:
        if name not in smoke_out:
            raise StepFailed(f"{name!r} did not run")
    profile = load(PROFILE).profile
    wrong = {role: page * 2 for role, page in (profile.expect.page_bytes or {}).items()}
    expect = dataclasses.replace(profile.expect, page_bytes=wrong)
    changed = dataclasses.replace(profile, expect=expect)
    failed = [c.name for c in geometry_checks(changed, facts) if not c.ok and not c.skipped]
    if failed != ["log: page bytes"]:
        raise StepFailed(f"page bytes {wrong} made {failed} fail, not exactly 'log: page bytes'")
    g = facts.kv_geometry
    return (f"plugin: {g.num_blocks} blocks of {g.block_sizes} tokens, pages "
            f"{g.page_bytes}, layers {g.layers}; page bytes {wrong} fails 'log: page bytes'")


def vllm_bench(run: Run, tokenizer: Path, *args: str) -> dict:
    result = run.work / f"vllm-bench-{len(list(run.work.glob('vllm-bench-*')))}.json"
    argv = [
        str(REPO / ".venv" / "bin" / "python"),
        "-c",
        VLLM_BENCH,
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        f"http://127.0.0.1:{HOST_PORT}",
        "--model",
        "kit-tiny-chat",
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--ignore-eos",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(run.work),
        "--result-filename",
        result.name,
        *args,
    ]
    run.sh(argv, env={"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}, timeout=900)
    return json.loads(result.read_text())


def kit_decode(run: Run, out: Path, extra: str) -> None:
    """One `make bench` decode cell (plus `extra` cells) into receipt `out`."""
    args = (f"--concurrency {DECODE_CONCURRENCY} --duration 10 --warmup 2 --repeats 1 "
            f"--max-tokens {DECODE_TOKENS} --skip parity {extra} --out {out}")  # fmt: skip
    make(run, "bench", f"PROFILE={PROFILE}", f"BENCH_ARGS={args}")


def busy_loop() -> subprocess.Popen[bytes]:
    """A process that keeps one core busy until it is killed (the other client's load)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def vllm_prefill_ttfts(run: Run, tokenizer: Path) -> list[float]:
    """TTFT (ms) of each completed request of one `vllm bench serve` prefill run."""
    result = vllm_bench(run, tokenizer, "--random-input-len", str(PREFILL_TOKENS),
                        "--random-output-len", "1", "--max-concurrency", "1",
                        "--num-prompts", str(PREFILL_PER_RUN), "--save-detailed",
                        # with thinking on, the one token is the <think> vLLM's reasoning
                        # parser consumes, and vLLM's client sees no chunk to time
                        "--extra-body", json.dumps(
                            {"chat_template_kwargs": {"enable_thinking": False}}),
                        # its random prompts follow the seed: a new one, or the prefix
                        # cache serves prompts an earlier run sent
                        "--seed", str(secrets.randbelow(2**31)),
                        # its ready check sends the first prompt once before timing it, so
                        # the timed first prompt was a prefix-cache hit (TTFT 106 ms) or
                        # queued behind the check (5.3 s against 3.5)
                        "--ready-check-timeout-sec", "0")  # fmt: skip
    return [t * 1000 for t, err in zip(result["ttfts"], result["errors"], strict=True)
            if t > 0 and not err]  # fmt: skip


def kit_prefill_ttfts(run: Run, out: Path) -> list[float]:
    """TTFT (ms) of each prompt of one `make bench` prefill-only run."""
    args = (f"--skip decode --skip parity --skip reuse --prefill-tokens {PREFILL_TOKENS} "
            f"--prefill-repeats {PREFILL_PER_RUN} --out {out}")  # fmt: skip
    make(run, "bench", f"PROFILE={PROFILE}", f"BENCH_ARGS={args}")
    samples = json.loads(out.read_text())["cells"][f"prefill-{PREFILL_TOKENS}"]["samples"]
    return [s["ttft_s"] * 1000 for s in samples if s["ok"]]


def step_bench(run: Run) -> str:
    """The kit's bench against the same server in the same run as `vllm bench serve`: decode at
    concurrency 4 with 128-token ignore-EOS streams, each vLLM run between two kit runs
    (`DECODE_PAIRS`), the median ratio compared, and each kit run checked against the server's
    own token counter over its window; prefill TTFT of 2,048-token prompts
    alternating the same way (`PREFILL_PAIRS`) with a busy loop on one core, medians compared."""
    tokenizer = run.work / "tokenizer"
    run.sh(["docker", "cp", f"{PROJECT}-vllm-1:/opt/models/kit-tiny-chat", str(tokenizer)])
    decode_args = ("--random-input-len", "4", "--random-output-len", str(DECODE_TOKENS),
                   "--max-concurrency", str(DECODE_CONCURRENCY),
                   "--num-prompts", str(DECODE_PROMPTS))  # fmt: skip
    receipt_path = run.work / "receipt.json"
    # the prefix-reuse cell on the real server: its GPU cache (131,072 tokens) keeps a
    # 1,024-token prompt through 4,096 others, which the cell must see in vLLM's counters
    reuse = (f"--skip prefill --reuse-tokens {REUSE_TOKENS} --reuse-evict-tokens 4096 "
             "--log")  # fmt: skip
    # kit, vLLM, kit, ..., kit: the last kit run also reads the log and the reuse cell
    receipts = [run.work / f"decode-{i}.json" for i in range(DECODE_PAIRS)] + [receipt_path]
    kit_decode(run, receipts[0], "--skip prefill --skip reuse")
    ref = []
    for i in range(DECODE_PAIRS):
        ref.append(vllm_bench(run, tokenizer, *decode_args)["output_throughput"])
        kit_decode(run, receipts[i + 1], reuse if i == DECODE_PAIRS - 1 else
                   "--skip prefill --skip reuse")  # fmt: skip
    # one untimed prompt of the length first: the server's first long prefill is slower
    chat(f"http://127.0.0.1:{HOST_PORT}", "word " * (PREFILL_TOKENS // 2), 1, timeout=120)
    kit_ttfts: list[float] = []
    ref_ttfts: list[float] = []
    loop = busy_loop()
    try:
        for i in range(PREFILL_PAIRS):
            kit_ttfts += kit_prefill_ttfts(run, run.work / f"prefill-{i}.json")
            ref_ttfts += vllm_prefill_ttfts(run, tokenizer)
    finally:
        loop.kill()
        loop.wait()
    receipt = json.loads(receipt_path.read_text())
    want_tokens = load(PROFILE).profile.expect.kv_cache_tokens
    if (receipt["log"] or {}).get("kv_cache_tokens") != want_tokens:
        raise StepFailed(
            f"the receipt's log facts are not the server's ({want_tokens} KV tokens): "
            f"{receipt['log']}"
        )
    reuse_sample = receipt["cells"][f"reuse-{REUSE_TOKENS}"]["samples"][0]
    if reuse_sample["evicted"] is not False or not reuse_sample["gpu_cache_hit_tokens"]:
        raise StepFailed(f"the prefix-reuse cell did not read vLLM's prefix-cache hits: "
                         f"{reuse_sample}")  # fmt: skip
    decode = [receipt_decode(path) for path in receipts]
    off_server = [(k, srv) for k, srv in decode if srv is None or abs(k - srv) > AGREEMENT * srv]
    # each vLLM run against the mean of the kit runs on either side of it: a drift of the
    # server's own speed cancels; the median ratio is compared
    kits = [k for k, _ in decode]
    ratios = [(before + after) / 2 / r
              for before, after, r in zip(kits[:-1], kits[1:], ref, strict=True)]  # fmt: skip
    ratio = statistics.median(ratios)
    off_vllm = abs(ratio - 1) > AGREEMENT
    shown = (
        f"decode tok/s at c{DECODE_CONCURRENCY}: kit {[round(k) for k, _ in decode]}, the "
        f"server's counter over the same windows {[round(srv or 0) for _, srv in decode]}, vllm "
        f"bench serve between them {[round(x) for x in ref]} (mean of the kit runs around each "
        f"/ vLLM {[round(x, 3) for x in ratios]}, median {ratio:.3f}); prefill TTFT ms at "
        f"{PREFILL_TOKENS} tokens, {PREFILL_PAIRS} "
        f"alternating runs with a busy loop on one core: kit {[round(t) for t in kit_ttfts]}, "
        f"vllm bench serve {[round(t) for t in ref_ttfts]}; prefix reuse: "
        f"{reuse_sample['gpu_cache_hit_tokens']:.0f} tokens from vLLM's prefix cache"
    )
    if off_server:
        raise StepFailed(f"kit decode more than {AGREEMENT:.0%} off the server's count: {shown}")
    if off_vllm:
        raise StepFailed(f"kit decode more than {AGREEMENT:.0%} off vllm bench serve's by the "
                         f"median pair: {shown}")
    if len(ref_ttfts) < PREFILL_PAIRS or len(kit_ttfts) < PREFILL_PAIRS * PREFILL_PER_RUN:
        raise StepFailed(f"too few prefill requests completed to compare: {shown}")
    kit_ttft, ref_ttft = statistics.median(kit_ttfts), statistics.median(ref_ttfts)
    if abs(kit_ttft - ref_ttft) > AGREEMENT * ref_ttft:
        raise StepFailed(f"prefill median more than {AGREEMENT:.0%} off vllm bench serve "
                         f"({kit_ttft:.0f} vs {ref_ttft:.0f} ms): {shown}")
    return f"receipt {receipt_path.name}; {shown} (medians {kit_ttft:.0f} and {ref_ttft:.0f} ms)"


def host_address_for_containers(run: Run) -> str:
    """This host's address on Docker's default bridge, which containers on any bridge reach."""
    return bridge_address(connect("start dockerd (tests/e2e/services.py start)"))


def step_fetch(run: Run) -> str:
    """`launch fetch` (what `make fetch` runs) through compose's fetch service: the image's own
    huggingface_hub downloads into the weights volume from a stand-in Hub on this host (the Hub
    is not reachable here) at the container network's gateway address, then verifies."""
    files = {"config.json": b'{"model_type": "llama"}\n',
             "model.safetensors": bytes(range(256)) * 48_000}  # fmt: skip
    hub = HubStandin({HUB_REPO: HubRepo(HUB_REPO, HUB_COMMIT, files)})
    server, url = hub.serve(host="0.0.0.0")
    env = {"HF_ENDPOINT": f"http://{host_address_for_containers(run)}:{url.rsplit(':', 1)[1]}"}
    sets = ["--set", f"engine.model={HUB_REPO}", "--set", f"engine.revision={HUB_COMMIT}"]
    fetch = [sys.executable, "-m", "launch", "fetch", PROFILE, *sets]
    try:
        before = run.sh([*fetch, "--check"], env=env, check=False)
        if before.returncode != 1 or "has not been fetched" not in before.stdout:
            raise StepFailed(f"check before fetching: exit {before.returncode}, {before.stdout!r}")
        done = run.sh(fetch, env=env, timeout=600)
        if f"{HUB_REPO}@{HUB_COMMIT}: 2 files" not in done.stdout:
            raise StepFailed(f"no verification line: {done.stdout[-300:]!r}")
        after = run.sh([*fetch, "--check"], env=env)
        again = run.sh(fetch, env=env, timeout=600)
    finally:
        server.shutdown()
    gets = len(hub.gets("model.safetensors"))
    if gets != 1:
        raise StepFailed(f"model.safetensors fetched {gets} times; a second run must reuse it")
    return (f"downloaded into volume {HF_CACHE_VOLUME} and verified; check before: not fetched, "
            f"after: {after.stdout.strip().splitlines()[-1][:80]}; a second run "
            f"{'downloads nothing' if again.returncode == 0 else 'failed'}")  # fmt: skip


def receipt_decode(path: Path) -> tuple[float, float | None]:
    """(kit tok/s, server counter tok/s) of the decode cell of a receipt."""
    sample = json.loads(path.read_text())["cells"][f"decode-c{DECODE_CONCURRENCY}"]["samples"][0]
    return sample["output_tok_s"], sample["server_output_tok_s"]


def step_replicas(run: Run) -> str:
    compose_down(run)
    make(run, "configure", f"PROFILE={PROFILE}", "REPLICAS=2")
    compose(run, "up", "--detach")
    names = [f"{PROJECT}-vllm-0-1", f"{PROJECT}-vllm-1-1"]
    wait_healthy(run, names)
    router = f"http://127.0.0.1:{HOST_PORT}"
    deadline = time.monotonic() + 60
    while True:  # the router starts once both replicas are healthy
        try:
            if requests.get(f"{router}/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            raise StepFailed("the router did not answer /health within 60 s")
        time.sleep(1)
    # cache-aware routing keeps a prompt on the replica holding its prefix and sends new ones to
    # the least loaded, so it takes concurrent requests with nothing in common to reach both
    prompts = [chr(ord("a") + i) * 60 for i in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda text: chat(router, text, 64, ignore_eos=True), prompts))
    served = [served_requests(HOST_PORT + 1 + i) for i in range(2)]
    if not all(served):
        raise StepFailed(f"requests per replica {served}: the router did not spread them")
    run.sh(["docker", "kill", names[0]])
    deadline = time.monotonic() + 60
    ok = 0
    while ok < 8:
        try:
            answer = chat(router, "Reply with exactly READY")
            ok = ok + 1 if answer == "READY" else 0
        except requests.RequestException:
            ok = 0
        if time.monotonic() > deadline:
            raise StepFailed("the endpoint did not keep answering after a replica was killed")
    return (
        f"requests per replica {[int(s) for s in served]}; after {names[0]} was killed, "
        "8 consecutive answers through the router"
    )


def kit_smoke(run: Run, *args: str) -> subprocess.Popen[str]:
    """`python -m smoke check` reading the service's containers, verdict as JSON."""
    argv = [str(REPO / ".venv-kit" / "bin" / "python"), "-m", "smoke", "check",
            "--profile", PROFILE, "--json", *args]  # fmt: skip
    return subprocess.Popen(argv, cwd=REPO, env=run.env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip


def step_killed_mid_check(run: Run) -> str:
    compose_down(run)
    make(run, "configure", f"PROFILE={PROFILE}")
    compose(run, "up", "--detach")
    timeout = 240
    smoke = kit_smoke(run, "--timeout", str(timeout))
    time.sleep(8)
    run.sh(["docker", "kill", f"{PROJECT}-vllm-1"])
    killed = time.monotonic()
    out, _ = smoke.communicate(timeout=timeout + 30)
    after = time.monotonic() - killed
    failed = [c for c in json.loads(out)["checks"] if not c["ok"]]
    if smoke.returncode != 1 or not failed or failed[0]["name"] != "ready: server up":
        raise StepFailed(f"smoke exited {smoke.returncode}, failed {failed[:1]}")
    if "exit code 137" not in failed[0]["seen"]:
        raise StepFailed(f"the verdict does not give the exit code: {failed[0]['seen']}")
    if after > 15:
        raise StepFailed(f"the wait went on {after:.0f} s after the kill ({timeout} s bound)")
    return f"'{failed[0]['name']}' failed {after:.0f} s after the kill: {failed[0]['seen'][:110]}"


@contextmanager
def user_setting(line: str) -> Iterator[None]:
    """A line in compose/.env above the generated block, as a user would add it."""
    text = ENV_PATH.read_text(encoding="utf-8")
    ENV_PATH.write_text(f"{line}\n{text}", encoding="utf-8")
    try:
        yield
    finally:
        ENV_PATH.write_text(text, encoding="utf-8")


def step_prefix_off(run: Run) -> str:
    """The server started with prefix caching off (as DCP > 1 silently did to users), the smoke
    run for the profile, which has it on: the prefix check must fail by name, with 0 hits."""
    compose_down(run)
    with user_setting("ENABLE_PREFIX_CACHING=false"):
        make(run, "configure", f"PROFILE={PROFILE}")
        compose(run, "up", "--detach")
    smoke = kit_smoke(run, "--only", "prefix", "--timeout", "240")
    out, _ = smoke.communicate(timeout=400)
    log = run.sh(["docker", "logs", f"{PROJECT}-vllm-1"]).stdout
    if "enable_prefix_caching=False" not in log:  # vLLM's own engine-config line
        raise StepFailed("the server's engine config does not show prefix caching off")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    prefix = checks.get("api: prefix cache reuse") or {}
    if smoke.returncode != 1 or prefix.get("ok") is not False or prefix.get("skipped"):
        raise StepFailed(f"smoke exited {smoke.returncode}: {prefix}")
    if not prefix["seen"].startswith("0 of "):
        raise StepFailed(f"hits other than 0 with caching off: {prefix['seen']}")
    return f"'{prefix['name']}' FAIL: {prefix['seen'][:150]}"


def step_kv_does_not_fit(run: Run) -> str:
    compose_down(run)
    # 1,048,576 tokens x 2,048 bytes = 2 GiB of KV cache for one request; the profile has 1 GiB
    with user_setting("MAX_MODEL_LEN=1048576"):
        make(run, "configure", f"PROFILE={PROFILE}")
        compose(run, "up", "--detach")
    timeout = 240
    start = time.monotonic()
    out, _ = kit_smoke(run, "--timeout", str(timeout)).communicate(timeout=timeout + 30)
    secs = time.monotonic() - start
    ready = json.loads(out)["checks"][0]
    if ready["ok"] or "ValueError: To serve at least one request" not in ready["seen"]:
        raise StepFailed(f"readiness: {ready}")
    if secs > timeout / 2:
        raise StepFailed(f"the wait took {secs:.0f} s of its {timeout} s; it should end at once")
    return f"wait ended after {secs:.0f} s: {ready['seen'][:150]}"


def step_down(run: Run) -> str:
    compose_down(run)
    left = project_containers(run)
    if left:
        raise StepFailed(f"{len(left)} container(s) of project {PROJECT} remain")
    return f"no container of project {PROJECT} remains"


# ---- the CUDA image: built, checked without a GPU, pinned, rendered, removed -------------------


def step_cuda_base(run: Run) -> str:
    tag = f"{REGISTRY}/glm53/debian:trixie"
    run.sh([sys.executable, "docker/debian_base.py", "--engine", "cuda", "--tag", tag, "--push"],
           timeout=600)  # fmt: skip
    run.state["cuda_base"] = tag
    make(run, "pin", f"IMAGE={tag}", "SOURCE=base")
    return f"BASE_IMAGE={read_lock(Path(run.env['KIT_IMAGES_LOCK']))['BASE_IMAGE']}"


def step_cuda_build(run: Run) -> str:
    start = time.monotonic()
    make(run, "build", f"TAG={CUDA_TAG}", "BUILD_ARGS=--trust-host-ca --allow-dirty", timeout=2700)
    secs = time.monotonic() - start
    size = int(run.sh(["docker", "image", "inspect", "--format", "{{.Size}}", CUDA_TAG]).stdout)
    summary = f"{CUDA_TAG} built in {secs:.0f} s; uncompressed size {size / 1e9:.2f} GB"
    if size > CUDA_MAX_BYTES:
        raise StepFailed(f"{summary}: over {CUDA_MAX_BYTES / 1e9:.0f} GB")
    return summary


def step_cuda_selfcheck(run: Run) -> str:
    out = run.sh(["docker", "run", "--rm", "--entrypoint", "python", CUDA_TAG,
                  "/opt/kit/docker/selfcheck.py", "--engine", "cuda"], timeout=900)  # fmt: skip
    return " | ".join(out.stdout.strip().splitlines())


def step_cuda_pin(run: Run) -> str:
    make(run, "pin", f"IMAGE={CUDA_TAG}", "SOURCE=kit", "LOCAL=1")
    pinned = read_lock(Path(run.env["KIT_IMAGES_LOCK"]))["KIT_IMAGE"]
    image_id = run.sh(["docker", "image", "inspect", "--format", "{{.Id}}", CUDA_TAG]).stdout
    if pinned != image_id.strip():
        raise StepFailed(f"KIT_IMAGE={pinned}, the image's ID is {image_id.strip()}")
    run.state["kit_id"] = pinned
    return f"KIT_IMAGE={pinned}"


def rendered_service(run: Run, profile: str, env: dict[str, str] | None = None) -> dict:
    run.sh(["make", "--no-print-directory", "configure", f"PROFILE={profile}"], env=env)
    config = run.sh(["docker", "compose", "config", "--format", "json"], cwd=COMPOSE_DIR)
    return json.loads(config.stdout)["services"]["vllm"]


def step_cuda_compose(run: Run) -> str:
    """`docker compose config` of both GLM profiles against the pinned CUDA image, with the GPU
    reservation; the qualified image of dflash-tp4-dcp4 gets the geometry plugin mounted."""
    seen = []
    for profile in GLM_PROFILES:
        service = rendered_service(run, profile, {"IMAGE_SOURCE": "kit"})
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        if service["image"] != run.state["kit_id"]:
            raise StepFailed(f"{profile}: image {service['image']}, not the pinned CUDA image")
        if devices != [{"driver": "nvidia", "device_ids": ["0,1,2,3"], "capabilities": ["gpu"]}]:
            raise StepFailed(f"{profile}: GPU reservation {devices}")
        seen.append(f"{profile} on {service['image'][:19]} with {devices[0]['driver']} GPUs")
    qualified = rendered_service(run, "dflash-tp4-dcp4")
    targets = {v["target"]: v["source"] for v in qualified["volumes"] if v["type"] == "bind"}
    if targets.get("/opt/kit/kvgeometry") != str(REPO / "kvgeometry"):
        raise StepFailed(f"the qualified image does not get the plugin: binds {targets}")
    return "; ".join(seen) + f"; dflash-tp4-dcp4 on {qualified['image'].split('@')[0]} mounts " \
        "launch/ and kvgeometry/ at /opt/kit"


def step_remove_images(run: Run) -> str:
    """Every image the run made or pulled leaves the engine again (the CPU image compose pulled,
    the CUDA image, both bases), and every volume it made; the registry's copies go with
    `.ci/run`'s state directory."""
    compose_down(run)
    made = volumes(run) - set(run.state.get("volumes", "").split())
    if made:
        run.sh(["docker", "volume", "rm", *sorted(made)])
    # children before the bases they were built on
    refs = [CUDA_TAG, *(run.state.get(k) for k in ("cuda_base", "ref", "cpu_base"))]
    present = [r for r in refs if r and run.sh(["docker", "image", "inspect", r],
                                               check=False).returncode == 0]  # fmt: skip
    for ref in present:
        run.sh(["docker", "image", "rm", ref])
    left = [r for r in [*refs, run.state.get("kit_id")] if r and run.sh(
        ["docker", "image", "inspect", r], check=False).returncode == 0]  # fmt: skip
    if left:
        raise StepFailed(f"still on the engine: {left}")
    return f"removed {len(present)} image(s): {', '.join(present)}; {len(made)} volume(s)"


CUDA_BASE_STEP = "CUDA base: Debian 13 from Debian's packages, pinned"
STEPS: tuple[tuple[str, Callable[[Run], str], tuple[str, ...]], ...] = (
    ("docker engine, compose, registry", step_engine, ()),
    (
        "Debian base image from Debian's packages, pinned",
        step_base,
        ("docker engine, compose, registry",),
    ),
    (
        "build the CPU image from the Dockerfile",
        step_build,
        ("Debian base image from Debian's packages, pinned",),
    ),
    ("no build input in any layer (CPU image)", step_layers,
     ("build the CPU image from the Dockerfile",)),
    ("push to the local registry", step_push, ("build the CPU image from the Dockerfile",)),
    ("make pin", step_pin, ("push to the local registry",)),
    ("remove the local copy", step_remove_local, ("make pin",)),
    ("docker compose up pulls by digest", step_compose_up, ("remove the local copy",)),
    ("healthcheck turns healthy", step_healthy, ("docker compose up pulls by digest",)),
    ("the server runs unprivileged, volumes writable, restarts", step_non_root,
     ("healthcheck turns healthy",)),
    ("make smoke passes every check", step_smoke, ("healthcheck turns healthy",)),
    (
        "make bench: decode and prefill = vllm bench serve",
        step_bench,
        ("healthcheck turns healthy",),
    ),
    ("make fetch: weights into the cache volume, verified", step_fetch, ("make pin",)),
    ("two replicas behind vllm-router", step_replicas, ("make pin",)),
    ("server killed during the smoke wait", step_killed_mid_check, ("make pin",)),
    ("prefix caching off fails the prefix check", step_prefix_off, ("make pin",)),
    ("KV cache that cannot fit ends the wait", step_kv_does_not_fit, ("make pin",)),
    ("docker compose down leaves nothing running", step_down, ("make pin",)),
    (CUDA_BASE_STEP, step_cuda_base, ("docker engine, compose, registry",)),
    ("build the CUDA image from the Dockerfile", step_cuda_build, (CUDA_BASE_STEP,)),
    ("no build input in any layer (CUDA image)", step_cuda_layers,
     ("build the CUDA image from the Dockerfile",)),
    ("CUDA image self-check in a container, no GPU", step_cuda_selfcheck,
     ("build the CUDA image from the Dockerfile",)),
    ("make pin LOCAL=1 (CUDA image)", step_cuda_pin, ("build the CUDA image from the Dockerfile",)),
    ("docker compose config of both GLM profiles", step_cuda_compose,
     ("make pin LOCAL=1 (CUDA image)",)),
    ("remove every image and volume the run made", step_remove_images,
     ("docker engine, compose, registry",)),
)


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="kit-e2e-"))
    lock = work / "images.lock"
    shutil.copy2(LOCK_PATH, lock)
    env = {**os.environ, "KIT_IMAGES_LOCK": str(lock), "HF_CACHE_VOLUME": HF_CACHE_VOLUME}
    for name in ("IMAGE", "PROFILE", "COMPOSE_FILE"):
        env.pop(name, None)
    saved_env = work / "user.env"
    if ENV_PATH.exists():
        shutil.move(ENV_PATH, saved_env)
    run = Run(work, env)
    print(f"e2e work directory {work}", flush=True)
    try:
        for name, body, needs in STEPS:
            run.step(name, lambda body=body: body(run), needs)
    finally:
        if ENV_PATH.exists():
            subprocess.run(
                ["docker", "compose", "down", "--volumes", "--timeout", "5"],
                cwd=COMPOSE_DIR,
                env=env,
                capture_output=True,
                check=False,
            )
            ENV_PATH.unlink()
        (COMPOSE_DIR / "replicas.generated.yaml").unlink(missing_ok=True)
        if saved_env.exists():
            shutil.move(saved_env, ENV_PATH)
    passed = sum(ok for _, ok, _, _ in run.results)
    print(f"e2e: {passed} passed, {len(run.results) - passed} failed")
    return 0 if passed == len(run.results) else 1


if __name__ == "__main__":
    sys.exit(main())

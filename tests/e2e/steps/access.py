"""Who may use the server: with an API key in compose/secrets, every route the real server
registers refuses a request without the key and one with a wrong key, except the documented
allow-list (launch/route_guard.py OPEN_ROUTES), and `/invocations` (open under vLLM's own
`--api-key`, vllm#58144) among them; the key reaches the container as a file, in no
`docker inspect`, log or plan output."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from collections.abc import Iterator

import requests

from launch.compose_config import ensure_secret_files
from launch.route_guard import OPEN_ROUTES
from launch.settings import SECRETS, SECRETS_DIR
from tests.e2e.harness import (
    HOST_PORT,
    PROFILE,
    Run,
    Step,
    StepFailed,
    container,
    make,
    serving,
    wait_healthy,
)
from tests.e2e.steps.images import PIN

ROUTE_TABLE = """\
import json, os
from starlette.routing import Mount, WebSocketRoute
from vllm.entrypoints.launchers.app import build_app
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:  # vLLM 0.32 (the CPU build)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

def server_argv():
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        argv = [a.decode() for a in raw.split(b"\\0") if a]
        # `vllm serve ...`, or `python3 /opt/venv/bin/vllm serve ...` as the kernel runs a script
        for i in range(1, len(argv) - 1):
            if argv[i] == "serve" and argv[i - 1].endswith("vllm"):
                return argv[i + 1:]
    raise SystemExit("no vllm serve process in this container")

args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(server_argv())
args.middleware = []  # the table of routes; the guard is not a route
app = build_app(args, ("generate",))
table = []
for route in app.routes:
    if isinstance(route, Mount):
        table.append(["MOUNT", route.path])
    elif isinstance(route, WebSocketRoute):
        table.append(["WEBSOCKET", route.path])
    else:
        table += [[m, route.path] for m in sorted(route.methods or ())]
print(json.dumps(table))
"""
"""Inside the running server's container: vLLM's own app built from the server's own command
line (read from /proc), as `vllm serve` builds it, and every route it registers, documented in
/openapi.json or not (FastAPI's docs routes, mounts such as /metrics, SageMaker's /invocations
and /ping). A chat model's server serves the "generate" task."""
PROBED_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")
"""A mount answers every method: each is probed."""


@contextlib.contextmanager
def api_key_file(key: str) -> Iterator[None]:
    """compose/secrets/vllm_api_key holding `key` while the step runs; what was there before (a
    user's key, or nothing) afterwards."""
    path = SECRETS_DIR / SECRETS["VLLM_API_KEY"]
    before = path.read_bytes() if path.exists() else None
    ensure_secret_files()  # as `make configure` leaves them: the directory 0700, files 0644
    path.write_text(key, encoding="utf-8")
    try:
        yield
    finally:
        if before is None:
            path.write_bytes(b"")
        else:
            path.write_bytes(before)


def concrete(path: str) -> str:
    """A route path with its parameters filled in ({model_name} -> x)."""
    return re.sub(r"\{[^}]+\}", "x", path)


PROBE_SECONDS: dict[tuple[str, str, bool], float] = {}
"""How long each probe took, by (method, path, with a key): the step names the slowest."""


def probe(method: str, path: str, key: str | None) -> int:
    """The status of one request, or 0 when the connection is refused or reset."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    start = time.monotonic()
    try:
        return requests.request(method, f"http://127.0.0.1:{HOST_PORT}{concrete(path)}",
                                headers=headers, json={}, timeout=30).status_code  # fmt: skip
    except requests.RequestException:
        return 0
    finally:
        PROBE_SECONDS[(method, path, key is not None)] = time.monotonic() - start


def every_route_behind_the_key(run: Run) -> str:
    """The server with a key in compose/secrets; its own route table; every HTTP route and
    method probed without a key, with a wrong key and with the right one (a WebSocket route is
    refused before it is accepted: tests/test_route_guard.py)."""
    key = secrets.token_urlsafe(24)
    with api_key_file(key):
        serving(run)
        secs = wait_healthy(run, [container()])
        plan = make(run, "plan", f"PROFILE={PROFILE}").stdout
        table = json.loads(run.sh(["docker", "exec", container(), "python3", "-c",
                                   ROUTE_TABLE]).stdout)  # fmt: skip
        routes = sorted({(m, p) for m, p in table if m != "WEBSOCKET"})
        probes = [(m, p) for kind, p in routes for m in (PROBED_METHODS if kind == "MOUNT"
                                                          else (kind,))]  # fmt: skip
        # every refusal first: a request with the key may change the server (a reset, a
        # pause), which must not decide what a request without one gets
        none = {r: probe(*r, None) for r in probes}
        wrong = {r: probe(*r, "wrong") for r in probes}
        right = {r: probe(*r, key) for r in probes}
        answered = {r: (none[r], wrong[r], right[r]) for r in probes}
        inspect = run.sh(["docker", "inspect", container()]).stdout
        log = run.sh(["docker", "logs", container()]).stdout
    run.state.api_key = key  # the server keeps serving with it: the stop step streams to it
    open_without_key = {r for r, (none, _, _) in answered.items() if none != 401}
    open_with_wrong = {r for r, (_, wrong, _) in answered.items() if wrong != 401}
    refused_with_key = sorted(r for r, (_, _, right) in answered.items() if right == 401)
    invocations = answered.get(("POST", "/invocations"))
    leaks = [where for where, text in (("docker inspect", inspect), ("the server log", log),
                                       ("make plan", plan)) if key in text]  # fmt: skip
    if open_without_key != set(OPEN_ROUTES) or open_with_wrong != set(OPEN_ROUTES):
        raise StepFailed(f"answered without the key: {sorted(open_without_key)}; with a wrong "
                         f"key: {sorted(open_with_wrong)}; the allow-list is "
                         f"{sorted(OPEN_ROUTES)}")  # fmt: skip
    if invocations is None or invocations[0] != 401:
        raise StepFailed(f"POST /invocations: {invocations} (not in the route table, or open)")
    if refused_with_key:
        raise StepFailed(f"refused with the right key: {refused_with_key}")
    if leaks:
        raise StepFailed(f"the key appears in {', '.join(leaks)}")
    if "--middleware launch.route_guard.RouteGuard" not in plan:
        raise StepFailed("make plan does not show the guard the server runs")
    documented = len(requests.get(f"http://127.0.0.1:{HOST_PORT}/openapi.json", timeout=30,
                                  headers={"Authorization": f"Bearer {key}"}).json()["paths"])
    slowest = sorted(PROBE_SECONDS.items(), key=lambda item: -item[1])[:3]
    timing = ", ".join(f"{m} {p}{' (key)' if keyed else ''} {t:.1f} s"
                       for (m, p, keyed), t in slowest)  # fmt: skip
    return (f"healthy after {secs:.0f} s with a key; {len(probes)} (method, path) pairs of the "
            f"server's {len(routes)} routes ({documented} paths in /openapi.json): all 401 "
            f"without the key and with a wrong one but {sorted(OPEN_ROUTES)}; POST /invocations "
            f"401; none refused with the key; the key in no docker inspect, log or plan; "
            f"slowest probes: {timing}")


EVERY_ROUTE = Step("every route behind the API key", every_route_behind_the_key, (PIN,))

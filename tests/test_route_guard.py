"""The route guard as ASGI (launch/route_guard.py), driven with the messages an ASGI server sends:
every HTTP path and method and every WebSocket refused without the right key, the allow-list
open, the key read from its file only, and no start without a key. The real server's routes are
probed in `make e2e` (tests/e2e/steps/access.py); vLLM's own guard is shown open on
/invocations here, with vLLM 0.33.0's own middleware class."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from launch.route_guard import KEY_FILE_VAR, MIDDLEWARE, OPEN_ROUTES, RouteGuard, bearer
from tests.conftest import launch_cli, plan_of

KEY = "k3y-Of-the-test"


async def app(scope, receive, send):
    """The app behind the guard: 200 for anything that reaches it."""
    if scope["type"] == "lifespan":
        return
    if scope["type"] == "websocket":
        await send({"type": "websocket.accept"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"reached"})


def call(guard, scope: dict) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False} if scope["type"] == \
            "http" else {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent


def http(method: str, path: str, token: str | None = None, scheme: str = "Bearer") -> dict:
    headers = [(b"authorization", f"{scheme} {token}".encode())] if token is not None else []
    return {"type": "http", "method": method, "path": path, "headers": headers}


@pytest.fixture
def guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RouteGuard:
    key_file = tmp_path / "vllm_api_key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv(KEY_FILE_VAR, str(key_file))
    return RouteGuard(app)


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("path", ["/invocations", "/v1/chat/completions", "/tokenize", "/metrics",
                                  "/load", "/version", "/scale_elastic_ep", "/openapi.json",
                                  "/no/such/route", "/health/../v1/models"])  # fmt: skip
def test_every_path_and_method_needs_the_key(guard, method, path):
    for token, scheme in ((None, "Bearer"), ("wrong", "Bearer"), (KEY, "Basic"), ("", "Bearer"),
                          (KEY[:-1], "Bearer"), (KEY + "x", "Bearer")):  # fmt: skip
        sent = call(guard, http(method, path, token, scheme))
        assert sent[0]["status"] == 401, (method, path, token, scheme)
        assert (b"www-authenticate", b"Bearer") in sent[0]["headers"]
    assert call(guard, http(method, path, KEY))[0]["status"] == 200


def test_only_the_allow_list_is_open(guard):
    assert {("GET", "/health")} == OPEN_ROUTES
    assert call(guard, http("GET", "/health"))[0]["status"] == 200
    assert call(guard, http("POST", "/health"))[0]["status"] == 401
    assert call(guard, http("GET", "/health/"))[0]["status"] == 401


def test_a_websocket_is_closed_before_it_is_accepted(guard):
    scope = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    assert call(guard, scope) == [{"type": "websocket.close", "code": 1008,
                                   "reason": "missing or wrong API key"}]  # fmt: skip
    keyed = {**scope, "headers": [(b"authorization", f"Bearer {KEY}".encode())]}
    assert call(guard, keyed) == [{"type": "websocket.accept"}]


def test_lifespan_passes_through(guard):
    assert call(guard, {"type": "lifespan"}) == []  # the app above sends nothing for it


def test_no_key_file_no_start(tmp_path, monkeypatch):
    """A guard asked for without a key stops the start: it never serves open."""
    monkeypatch.setenv(KEY_FILE_VAR, str(tmp_path / "absent"))
    with pytest.raises(RuntimeError, match="refusing to serve without it"):
        RouteGuard(app)
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv(KEY_FILE_VAR, str(tmp_path / "empty"))
    with pytest.raises(RuntimeError):
        RouteGuard(app)


def test_bearer_reads_the_header_as_sent():
    assert bearer([(b"Authorization", b"Bearer  abc ")]) == b"abc"
    assert bearer([(b"authorization", b"bearer abc")]) == b"abc"
    assert bearer([(b"authorization", b"Basic abc")]) is None
    assert bearer([]) is None


def test_the_plan_adds_the_guard_only_with_a_key(hermetic_settings):
    """`make plan` shows what the server runs: the middleware with a key, nothing without; the
    key itself is in no plan output."""
    assert "--middleware" not in plan_of("cpu-tiny").argv
    (hermetic_settings / "vllm_api_key").write_text(KEY)
    argv = plan_of("cpu-tiny").argv
    assert argv[argv.index("--middleware") + 1] == MIDDLEWARE
    assert KEY not in " ".join(argv) and KEY not in str(plan_of("cpu-tiny").to_json())


@pytest.mark.vllm
def test_vllms_own_api_key_guard_leaves_invocations_open():
    """Why the kit brings its own: vLLM 0.33.0's AuthenticationMiddleware, driven the same way,
    lets /invocations, /tokenize and /metrics through without a key (vllm#58144)."""
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    vllm_guard = AuthenticationMiddleware(app, tokens=[KEY])
    assert call(vllm_guard, http("POST", "/v1/chat/completions"))[0]["status"] == 401
    for path in ("/invocations", "/tokenize", "/metrics"):
        assert call(vllm_guard, http("POST", path))[0]["status"] == 200, path


@pytest.mark.usefixtures("engine_unreachable")
@pytest.mark.parametrize("name", ["VLLM_API_KEY", "HF_TOKEN"])
def test_a_secret_in_compose_env_is_refused_before_anything_is_written(hermetic_settings, name):
    """compose passes compose/.env to the container as its environment, which `docker inspect`
    shows: `make configure` (and so `make up`) refuses the line, naming the file it belongs in."""
    env_file = hermetic_settings / ".env"
    env_file.write_text(f"{name}=s3cret\n")
    done = launch_cli("configure", "cpu-tiny")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"error: {name}='set in compose/.env': would reach the server as environment" in (
        done.stderr)
    file = {"VLLM_API_KEY": "vllm_api_key", "HF_TOKEN": "hf_token"}[name]
    assert f"> compose/secrets/{file}`" in done.stderr
    assert "s3cret" not in done.stderr
    assert env_file.read_text() == f"{name}=s3cret\n"  # nothing written


@pytest.mark.usefixtures("engine_unreachable")
def test_the_server_refuses_a_secret_in_its_environment():
    """Inside the container (`launch run`): a key that reached the environment anyway (compose
    run by hand with an old compose/.env) stops the start, exit 2, nothing started."""
    done = launch_cli("run", "cpu-tiny", "--dry-run", env={"VLLM_API_KEY": "s3cret"})
    assert done.returncode == 2 and "the server's environment" in done.stderr
    assert "vllm serve" not in done.stderr and "s3cret" not in done.stderr


@pytest.mark.usefixtures("engine_unreachable")
def test_a_wide_bind_needs_a_key(hermetic_settings):
    done = launch_cli("configure", "cpu-tiny", "--dry-run", env={"BIND_ADDRESS": "0.0.0.0"})
    assert done.returncode == 2
    assert "error: BIND_ADDRESS='0.0.0.0': publishes the API beyond this host" in done.stderr
    assert str(hermetic_settings / "vllm_api_key") in done.stderr
    (hermetic_settings / "vllm_api_key").write_text(KEY)
    keyed = launch_cli("configure", "cpu-tiny", "--dry-run", env={"BIND_ADDRESS": "0.0.0.0"})
    assert "BIND_ADDRESS" not in keyed.stderr  # past the bind rule (the lock has no CPU image)

"""Every route behind the API key: the ASGI middleware `launch run` gives vLLM (`--middleware`).

vLLM's own `--api-key` guard is a path-prefix test (`/v1`, `/v2`, `/inference`, `/cohere`):
`POST /invocations` answers a full completion without a key, and `/tokenize`, `/metrics`, `/load`,
`/version`, `/scale_elastic_ep` answer too (vllm#58144; vLLM's security docs say not to rely on
`--api-key` alone). This guard refuses every HTTP request and WebSocket of the server without
`Authorization: Bearer <key>`, whatever its path, except `OPEN_ROUTES` (the healthcheck's probe);
the key is compared in constant time. It is a middleware rather than a proxy in front: it runs
inside vLLM's own app, so a route vLLM adds in a later version is guarded without the kit knowing
its name, and nothing else listens.

The key comes from a file (a Compose or Kubernetes secret), never from the environment, so it
appears in no `docker inspect`, plan or log. It imports only the standard library and what vLLM
itself requires (Starlette, through FastAPI): it runs in any runtime image.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

KEY_FILE_VAR = "KIT_API_KEY_FILE"
"""Where the launcher and the middleware find the key file (compose: /run/secrets/vllm_api_key)."""
MIDDLEWARE = "launch.route_guard.RouteGuard"
"""What `launch run` passes to `vllm serve --middleware` when a key is set."""
OPEN_ROUTES = frozenset({("GET", "/health")})
"""(method, path) answered without a key: the container healthcheck's and a load balancer's probe
(it says only that the server is up). `/metrics` is not among them: a scraper sends the key
(Prometheus `authorization: {credentials_file: ...}`)."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def read_key(path: Path) -> str | None:
    """The key in a secret file (surrounding whitespace dropped), or None when the file is absent
    or empty (no key set)."""
    try:
        key = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return key or None


def bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the request's `Authorization: Bearer <token>` header, if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" else None
    return None


def allowed(method: str, path: str, token: bytes | None, key: bytes) -> bool:
    """Whether a request may pass: an open route, or the right key (compared in constant time)."""
    if (method, path) in OPEN_ROUTES:
        return True
    return token is not None and hmac.compare_digest(token, key)


class RouteGuard:
    """ASGI middleware: every HTTP request and WebSocket without the key gets 401 (a WebSocket is
    closed with 1008 before it is accepted). The key file is read once, at start; a guard asked
    for without a readable, non-empty key file stops the start instead of serving open."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        path = Path(os.environ.get(KEY_FILE_VAR, ""))
        key = read_key(path) if path.name else None
        if key is None:
            raise RuntimeError(f"{MIDDLEWARE}: no API key in {KEY_FILE_VAR}={str(path)!r}; "
                               "refusing to serve without it")  # fmt: skip
        self.key = key.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        method = scope.get("method", "GET") if kind == "http" else "WEBSOCKET"
        if allowed(method, scope["path"], bearer(scope.get("headers") or []), self.key):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            from starlette.websockets import WebSocketClose

            await WebSocketClose(code=1008, reason="missing or wrong API key")(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        refusal = JSONResponse({"error": "missing or wrong API key"}, status_code=401,
                               headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        await refusal(scope, receive, send)

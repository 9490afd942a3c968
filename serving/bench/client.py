"""The timed streams of the bench and the soak: OpenAI chat completions streamed over SSE on the
kit's HTTP client library (httpx, asynchronous; the checks use it synchronously,
`smoke.client`), with arrival times taken as the bytes arrive.

The load generator must not be the bottleneck nor bias latency. Each request has a connection
of its own (a client per stream, so no pool caps the concurrency; the clients share one TLS
context, built once, since building one is most of a client's cost). HTTP/1.1 framing, chunked
or not, is httpx's (h11). The body is split into SSE events here and the server's own token
count read from `continuous_usage_stats` (no re-tokenizing). Arrival times are taken once per
piece of body httpx hands over, one per network read: all tokens in one read arrived together.
TTFT runs from the moment the request body was sent (httpx's `http11.send_request_body`
trace event).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from smoke.client import CONNECT_TIMEOUT

_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens":\s*(\d+)')
_ERROR_EVENT = re.compile(rb'^data: (\{"error":.*)$', re.MULTILINE)
"""An error vLLM reports inside a stream that had begun (its `ErrorResponse` as an SSE event,
then `[DONE]`): HTTP 200 and a `[DONE]`, yet the request failed."""
BODY_SENT = "http11.send_request_body.complete"
"""httpcore's trace event once the request's last byte is written."""


@dataclass(frozen=True)
class Target:
    """Where the timed streams go: the server's base URL and its API key."""

    base_url: str
    api_key: str | None = None

    @classmethod
    def from_url(cls, url: str, api_key: str | None = None) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: only http://host:port URLs are supported")
        return cls(url.rstrip("/"), api_key)

    def headers(self) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {**auth, "Content-Type": "application/json", "Accept": "text/event-stream"}


@dataclass
class StreamResult:
    """One streamed request: times are `time.perf_counter()` seconds."""

    t_queued: float
    t_sent: float = 0.0
    t_first: float | None = None
    t_end: float | None = None
    status: int | None = None
    done: bool = False
    cancelled: bool = False  # stopped by the caller (a bench window ended), not a failure
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    marks: list[tuple[float, int]] = field(default_factory=list)  # (arrival, tokens so far)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200 and self.done


def error_message(event: bytes) -> str:
    """The message of an SSE error event's JSON (the event itself when it has none)."""
    try:
        return str(json.loads(event)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return event[:200].decode("utf-8", "replace")


class SseTokens:
    """A streamed chat completion's body, fed as it arrives, into `result`: the completion
    tokens so far at each arrival, the prompt's tokens, an error event, `[DONE]`."""

    def __init__(self, result: StreamResult) -> None:
        self.result = result
        self.pending = bytearray()  # body bytes not yet split into SSE events

    def feed(self, body: bytes, now: float) -> None:
        self.pending += body
        cut = self.pending.rfind(b"\n\n")
        if cut < 0:
            return
        complete = bytes(self.pending[: cut + 2])
        del self.pending[: cut + 2]
        r = self.result
        match = None
        for match in _TOKENS.finditer(complete):  # noqa: B007 - the last match is wanted
            pass
        if match is not None:
            tokens = int(match.group(1))
            if tokens > r.completion_tokens:
                if r.t_first is None:
                    r.t_first = now
                r.completion_tokens = tokens
                r.marks.append((now, tokens))
            if r.prompt_tokens is None and (p := _PROMPT.search(complete)):
                r.prompt_tokens = int(p.group(1))
        if r.error is None and (failed := _ERROR_EVENT.search(complete)):
            r.error = f"error event: {error_message(failed.group(1))}"
        if complete.endswith(b"data: [DONE]\n\n"):
            r.done = True
            r.t_end = now


@functools.cache
def _tls() -> ssl.SSLContext:
    """The one TLS context every client shares (the kit's URLs are http://; httpx builds one
    per client unless given one, about 40 ms of CPU each)."""
    return ssl.create_default_context()


def _client(timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=_tls(), timeout=httpx.Timeout(timeout,
                                                                  connect=CONNECT_TIMEOUT))


async def stream_chat(
    target: Target, payload: bytes, *, timeout: float, result: StreamResult | None = None
) -> StreamResult:
    """POST a pre-encoded streaming chat request; return what arrived, never raise.

    Pass `result` to watch a request that may be cancelled: it holds what arrived until then.
    """
    result = result if result is not None else StreamResult(t_queued=time.perf_counter())
    events = SseTokens(result)

    async def sent(event: str, _info: dict[str, Any]) -> None:
        if event == BODY_SENT:
            result.t_sent = time.perf_counter()

    try:
        async with asyncio.timeout(timeout), _client(timeout) as client, client.stream(
            "POST", f"{target.base_url}/v1/chat/completions", content=payload,
            headers=target.headers(), extensions={"trace": sent},
        ) as response:  # fmt: skip
            result.status = response.status_code
            if result.status != 200:
                result.error = f"HTTP {result.status}"
                return result
            async for body in response.aiter_raw():
                events.feed(body, time.perf_counter())
                if result.done:
                    return result
        result.error = result.error or "connection closed before [DONE]"
    except (TimeoutError, httpx.TimeoutException):  # the whole stream's, or one read's
        result.error = result.error or f"timed out after {timeout:.0f} s"
    except httpx.RemoteProtocolError as err:
        # the server closed mid-response: a cut stream once the head came, else no answer
        result.error = result.error or ("connection closed before [DONE]"
                                         if result.status == 200 else f"HTTP framing: {err}")
    except (httpx.HTTPError, OSError) as err:
        result.error = result.error or f"connection failed: {err}"
    except asyncio.CancelledError:
        # The caller stopped it; closing the connection may already have reported the cut.
        result.cancelled = True
        raise
    return result


async def request_json(target: Target, method: str, path: str, body: object | None = None,
                       *, timeout: float = 60.0) -> tuple[int, object]:  # fmt: skip
    """A small non-streaming request; (status, decoded JSON or text)."""
    async with _client(timeout) as client:
        response = await client.request(method, f"{target.base_url}{path}", json=body,
                                        headers=target.headers())  # fmt: skip
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text

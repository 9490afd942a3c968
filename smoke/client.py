"""The kit's HTTP client for a running vLLM server: chat requests, their SSE streams, prompts of
an exact token length by the server's own tokenizer, and `/metrics`, for the checks (this
module's functions) and for the serving tools' timed streams (`serving.bench.client`, on the
same library and the same `Server`).

httpx, synchronous here and asynchronous for the timed streams: the checks need status codes and
raw SSE lines, which the official OpenAI client hides. Every request has a connect and read
timeout, and a stream also has an overall deadline, so a hung server fails a named check in
bounded time instead of hanging. A failure of the server's answer raises `CheckFailed` with what
was seen; a request that never got an answer raises `RequestError` (`Timeout` when it ran out
of time).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Where vLLM puts separated thinking: `reasoning` in 0.33, `reasoning_content` before (and in
the fork's builds)."""
REASONING_BUDGET = 2048
"""max_tokens of an exact-answer request to a reasoning server: the thinking comes first."""
FILLER = ("The river bends past the old mill, where the miller keeps his ledgers in a dry "
          "room above the wheel. ")  # fmt: skip
"""The sentence long prompts are made of (whole sentences, then its words, then `PIECES`)."""
PIECES = (" a", ".", "a", " ")
"""Short pieces that close the last gap when a filler word overshoots by more than one token."""
Messages = list[dict[str, Any]]
RequestError = httpx.HTTPError
"""A request that got no answer: refused, reset, timed out (the library's base class)."""
Timeout = httpx.TimeoutException
CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Server:
    base_url: str
    model_id: str
    api_key: str | None = None
    timeout: float = 60.0
    reasoning: bool = False
    """The server separates reasoning (the profile names a reasoning parser). Exact-answer
    requests then ask for no thinking (`chat_template_kwargs.enable_thinking=false`, GLM-4.x's
    switch) and leave room for it anyway: vLLM 0.33.0 notes that GLM-5.3's template has no such
    switch and always reasons (`vllm/parser/glm47_moe.py`), and the answer is judged from
    `content` alone."""
    max_model_len: int | None = None
    """The context the server serves (`/v1/models`' max_model_len), when it says: vLLM answers
    400 to a max_tokens above it, so a request asks for at most half of it (the rest is for the
    prompt)."""

    def answer_budget(self, tokens: int) -> int:
        budget = max(tokens, REASONING_BUDGET) if self.reasoning else tokens
        if self.max_model_len is not None:
            budget = min(budget, self.max_model_len // 2)
        return budget

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path

    def timeouts(self) -> httpx.Timeout:
        """The connect timeout, and this server's for everything else."""
        return httpx.Timeout(self.timeout, connect=CONNECT_TIMEOUT)


class CheckFailed(Exception):
    """The server's answer is wrong: the message is what the verdict shows as seen."""


class StreamCut(CheckFailed):
    """The stream ended without `data: [DONE]`."""


@functools.cache
def _client() -> httpx.Client:
    """One connection pool for the process (httpx's client is safe to share between threads);
    each request carries its server's headers and timeouts. No cap on open connections: a check
    may hold many streams open at once (the default pool would make the 101st wait)."""
    return httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))


def send(server: Server, method: str, path: str, *, body: object | None = None,
         stream: bool = False, timeouts: httpx.Timeout | None = None) -> httpx.Response:
    """One request (the server's timeouts unless given); with `stream` the body is left to
    read (close the response when done)."""
    request = _client().build_request(method, server.url(path), json=body,
                                      headers=server.headers(),
                                      timeout=timeouts or server.timeouts())  # fmt: skip
    return _client().send(request, stream=stream)


def decode_json(response: httpx.Response) -> dict[str, Any]:
    """The JSON object of a 200 answer."""
    if response.status_code != 200:
        raise CheckFailed(f"HTTP {response.status_code}: {response.text[:120]!r}")
    try:
        data = response.json()
    except ValueError as err:
        raise CheckFailed(f"malformed JSON: {response.text[:80]!r}") from err
    if not isinstance(data, dict):
        raise CheckFailed(f"JSON is not an object: {response.text[:80]!r}")
    return data


def post_json(server: Server, extra: dict[str, Any], *,
              thinking_off: bool = False) -> httpx.Response:  # fmt: skip
    """One greedy chat completion request with `extra` fields (messages, max_tokens, ...);
    `thinking_off` asks a reasoning server for a direct answer."""
    body: dict[str, Any] = {"model": server.model_id, "temperature": 0, **extra}
    if thinking_off and server.reasoning:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return send(server, "POST", "/v1/chat/completions", body=body,
                stream=bool(body.get("stream")))


def post_chat(server: Server, prompt: str, max_tokens: int, *,
              stream: bool = False) -> httpx.Response:  # fmt: skip
    """One greedy exact-answer request (streamed with usage when `stream`)."""
    extra: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
    }
    if stream:
        extra |= {"stream": True, "stream_options": {"include_usage": True}}
    return post_json(server, extra, thinking_off=True)


def ask(server: Server, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One greedy, non-streaming exact-answer chat completion, decoded."""
    return decode_json(post_chat(server, prompt, max_tokens))


def sse_chunks(server: Server, response: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a streamed response until [DONE], within the request timeout; a
    stream that ends without [DONE] raises `StreamCut`."""
    deadline = time.monotonic() + server.timeout
    try:
        if response.status_code != 200:
            response.read()
            raise CheckFailed(f"HTTP {response.status_code}: {response.text[:120]!r}")
        for raw in response.iter_lines():
            if time.monotonic() > deadline:
                raise CheckFailed(f"stream exceeded {server.timeout:.0f} s")
            line = raw.strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                yield json.loads(data)
            except ValueError as err:
                raise CheckFailed(f"chunk is not JSON: {data[:60]!r}") from err
    finally:
        response.close()
    raise StreamCut("stream ended without [DONE]")


def stream_chunks(server: Server, extra: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a streamed request with `extra` fields."""
    return sse_chunks(server, post_json(server, extra))


def first_choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CheckFailed(f"no choices in response: {json.dumps(data)[:100]}")
    return choices[0]


def message_of(data: dict[str, Any]) -> dict[str, Any]:
    """The message of a non-streamed answer's first choice."""
    return first_choice(data).get("message") or {}


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The separated thinking of a message or delta, under whichever field the server uses."""
    return next((message[k] for k in REASONING_FIELDS if message.get(k)), None)


def usage_counts(data: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt, completion, total) tokens of an answer's usage."""
    usage = data.get("usage")
    if not isinstance(usage, dict):
        raise CheckFailed("no usage in response")
    try:
        p, c, t = (int(usage[k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckFailed(f"usage incomplete: {usage}") from err
    return p, c, t


def models(server: Server) -> list[dict[str, Any]]:
    """The model cards `/v1/models` lists (raises CheckFailed or RequestError)."""
    data = decode_json(send(server, "GET", "/v1/models"))
    return [m for m in data.get("data", []) if isinstance(m, dict)]


def served_context(server: Server) -> int | None:
    """`max_model_len` of the served model in `/v1/models` (vLLM reports it), or None."""
    try:
        cards = models(server)
    except (CheckFailed, RequestError):
        return None
    for model in cards:
        if model.get("id") == server.model_id:
            value = model.get("max_model_len")
            return value if isinstance(value, int) and value > 0 else None
    return None


def metrics_text(server: Server) -> str:
    """The server's Prometheus exposition (`/metrics`)."""
    response = send(server, "GET", "/metrics")
    if response.status_code != 200:
        raise CheckFailed(f"/metrics answered HTTP {response.status_code}")
    return response.text


def count_tokens(server: Server, messages: Messages) -> int:
    """The chat-templated prompt length by the server's own tokenizer (`/tokenize`)."""
    response = send(server, "POST", "/tokenize",
                    body={"model": server.model_id, "messages": messages})
    if response.status_code != 200:
        raise CheckFailed(f"/tokenize answered HTTP {response.status_code}; the server must run "
                          "with its tokenizer endpoint (vLLM's default) to build exact prompts")
    data = decode_json(response)
    if not isinstance(data.get("count"), int):
        raise CheckFailed(f"/tokenize gave no count: {json.dumps(data)[:80]}")
    return data["count"]


def fewest_reaching(server: Server, tokens: int,
                    messages: Callable[[int], Messages]) -> tuple[int, int]:  # fmt: skip
    """The fewest filler sentences n for which `messages(n)` counts at least `tokens` by the
    server's tokenizer (doubling, then bisection), and that count."""
    lo, hi = 0, 1
    while (count := count_tokens(server, messages(hi))) < tokens:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if (mid_count := count_tokens(server, messages(mid))) >= tokens:
            hi, count = mid, mid_count
        else:
            lo = mid
    return hi, count


def exact_messages(server: Server, tokens: int, compose: Callable[[str], Messages]) -> Messages:
    """`compose(filler)` for a filler text that makes it exactly `tokens` tokens long by the
    server's tokenizer: the most whole FILLER sentences below the target, then FILLER's words
    and, where a word overshoots, `PIECES`, each kept while the count stays at or below it (a
    tokenizer may count a word as several tokens, so words alone cannot reach every length)."""
    n, count = fewest_reaching(server, tokens, lambda n: compose(FILLER * n))
    if count == tokens:
        return compose(FILLER * n)
    text = FILLER * (n - 1)
    count = count_tokens(server, compose(text))
    words = [word + " " for word in FILLER.split()]
    for step in range(4 * len(words)):
        for piece in (words[step % len(words)], *PIECES):
            grown = count_tokens(server, compose(text + piece))
            if grown == tokens:
                return compose(text + piece)
            if count < grown < tokens:
                text, count = text + piece, grown
                break
        else:
            break
    raise CheckFailed(f"no prompt of exactly {tokens:,} tokens could be built (reached {count:,})")

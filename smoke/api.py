"""OpenAI chat-completions checks against a running server, each bounded in time.

Plain `requests`: the checks need status codes, raw SSE lines and arrival times, which the
official client hides. Every request has a connect and read timeout, and streaming also has an
overall deadline, so a hung server fails a named check in bounded time instead of hanging.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests

from smoke.verdict import Check

READY_PROMPT = "Reply with exactly READY"
LENGTH_PROMPT = "Count from one to one hundred in words, separated by commas."
LENGTH_LIMIT = 5
REASONING_FIELDS = ("reasoning", "reasoning_content")
"""Where vLLM puts separated thinking: `reasoning` in 0.33, `reasoning_content` before (and in
the fork's builds)."""
REASONING_BUDGET = 2048
"""max_tokens of an exact-answer request to a reasoning server: the thinking comes first."""


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


class CheckFailed(Exception):
    """A check's own failure: the message is what the verdict shows as seen."""


def _guard(name: str, expected: str, body: Callable[[], str]) -> Check:
    """Run one check; any transport or protocol failure becomes a failed check, not a traceback."""
    try:
        return Check(name, expected, body(), True)
    except CheckFailed as err:
        return Check(name, expected, str(err), False)
    except requests.Timeout:
        return Check(name, expected, "timed out", False)
    except requests.RequestException as err:
        return Check(name, expected, f"request failed: {type(err).__name__}", False)


def _json(response: requests.Response) -> dict[str, Any]:
    if response.status_code != 200:
        raise CheckFailed(f"HTTP {response.status_code}: {response.text[:120]!r}")
    try:
        data = response.json()
    except ValueError as err:
        raise CheckFailed(f"malformed JSON: {response.text[:80]!r}") from err
    if not isinstance(data, dict):
        raise CheckFailed(f"JSON is not an object: {response.text[:80]!r}")
    return data


def _post_json(
    server: Server, extra: dict[str, Any], *, thinking_off: bool = False
) -> requests.Response:
    """One greedy chat completion request with `extra` fields (messages, max_tokens, ...);
    `thinking_off` asks a reasoning server for a direct answer."""
    body: dict[str, Any] = {"model": server.model_id, "temperature": 0, **extra}
    if thinking_off and server.reasoning:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return requests.post(
        server.url("/v1/chat/completions"),
        json=body,
        headers=server.headers(),
        stream=bool(body.get("stream")),
        timeout=(5, server.timeout),
    )


def _post_chat(
    server: Server, prompt: str, max_tokens: int, *, stream: bool = False
) -> requests.Response:
    """One greedy exact-answer request (streamed with usage when `stream`)."""
    extra: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
    }
    if stream:
        extra |= {"stream": True, "stream_options": {"include_usage": True}}
    return _post_json(server, extra, thinking_off=True)


class StreamCut(CheckFailed):
    """The stream ended without `data: [DONE]`."""


def _sse_chunks(server: Server, response: requests.Response) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a streamed response until [DONE], within the request timeout; a
    stream that ends without [DONE] raises `StreamCut`."""
    deadline = time.monotonic() + server.timeout
    if response.status_code != 200:
        raise CheckFailed(f"HTTP {response.status_code}: {response.text[:120]!r}")
    try:
        for raw in response.iter_lines(chunk_size=None, decode_unicode=False):
            if time.monotonic() > deadline:
                raise CheckFailed(f"stream exceeded {server.timeout:.0f} s")
            line = raw.decode("utf-8", "replace").strip()
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


def _stream_chunks(server: Server, extra: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a streamed request with `extra` fields."""
    return _sse_chunks(server, _post_json(server, extra))


def _ask(server: Server, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One greedy, non-streaming chat completion, decoded."""
    return _json(_post_chat(server, prompt, max_tokens))


def _choice(data: dict[str, Any]) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise CheckFailed(f"no choices in response: {json.dumps(data)[:100]}")
    return choices[0]


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The separated thinking of a message or delta, under whichever field the server uses."""
    return next((message[k] for k in REASONING_FIELDS if message.get(k)), None)


def _usage(data: dict[str, Any]) -> tuple[int, int, int]:
    usage = data.get("usage")
    if not isinstance(usage, dict):
        raise CheckFailed("no usage in response")
    try:
        p, c, t = (int(usage[k]) for k in ("prompt_tokens", "completion_tokens", "total_tokens"))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckFailed(f"usage incomplete: {usage}") from err
    return p, c, t


def _models(server: Server) -> list[dict[str, Any]]:
    """The model cards `/v1/models` lists (raises CheckFailed or a requests error)."""
    data = _json(
        requests.get(server.url("/v1/models"), headers=server.headers(),
                     timeout=(5, server.timeout))
    )  # fmt: skip
    return [m for m in data.get("data", []) if isinstance(m, dict)]


def served_context(server: Server) -> int | None:
    """`max_model_len` of the served model in `/v1/models` (vLLM reports it), or None."""
    try:
        models = _models(server)
    except (CheckFailed, requests.RequestException):
        return None
    for model in models:
        if model.get("id") == server.model_id:
            value = model.get("max_model_len")
            return value if isinstance(value, int) and value > 0 else None
    return None


def check_model_id(server: Server) -> Check:
    def body() -> str:
        ids = [m.get("id") for m in _models(server)]
        if server.model_id not in ids:
            raise CheckFailed(f"served ids {ids}")
        return server.model_id

    return _guard("api: served model id", server.model_id, body)


def check_ready_answer(server: Server) -> Check:
    def body() -> str:
        data = _ask(server, READY_PROMPT, server.answer_budget(16))
        content = (_choice(data).get("message") or {}).get("content")
        if not isinstance(content, str) or content.strip() != "READY":
            raise CheckFailed(f"answer {content!r}")
        return repr(content.strip())

    return _guard("api: chat answers READY", "'READY' (temperature 0)", body)


def check_usage(server: Server) -> Check:
    def body() -> str:
        data = _ask(server, READY_PROMPT, 16)
        content = (_choice(data).get("message") or {}).get("content") or ""
        p, c, t = _usage(data)
        if p <= 0 or t != p + c:
            raise CheckFailed(f"prompt {p} + completion {c} != total {t}")
        if c < 1:
            raise CheckFailed(f"completion_tokens {c} for text {content!r}")
        return f"prompt {p} + completion {c} = total {t}"

    return _guard(
        "api: usage counts consistent", "prompt + completion = total, completion >= 1", body
    )


def check_length_limit(server: Server) -> Check:
    def body() -> str:
        data = _ask(server, LENGTH_PROMPT, LENGTH_LIMIT)
        reason = _choice(data).get("finish_reason")
        _, completion, _ = _usage(data)
        if reason != "length" or completion != LENGTH_LIMIT:
            raise CheckFailed(f"finish_reason {reason!r}, completion_tokens {completion}")
        return f"finish_reason 'length', {completion} tokens"

    return _guard(
        "api: max_tokens honoured", f"finish_reason 'length', {LENGTH_LIMIT} tokens", body
    )


def check_stream(server: Server) -> Check:
    def body() -> str:
        arrivals: list[float] = []
        response = _post_chat(server, LENGTH_PROMPT, 32, stream=True)
        try:
            for chunk in _sse_chunks(server, response):
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if any(delta.get(k) for k in ("content", *REASONING_FIELDS)):
                        arrivals.append(time.monotonic())
        except StreamCut as err:
            raise CheckFailed(f"{err} after {len(arrivals)} text chunks") from err
        if len(arrivals) < 2:
            raise CheckFailed(f"{len(arrivals)} text chunk(s); not incremental")
        return f"{len(arrivals)} text chunks, then [DONE]"

    return _guard("api: streaming SSE", "incremental chunks ending in [DONE]", body)

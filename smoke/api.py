"""The basic chat-completions checks: the served model id, an exact answer, streaming, the
max_tokens limit and usage counts. Each takes its `Label` from the registry (`smoke.checks`)."""

from __future__ import annotations

import time

from smoke.check import Check, Label, guard
from smoke.client import (
    REASONING_FIELDS,
    CheckFailed,
    Server,
    StreamCut,
    ask,
    first_choice,
    message_of,
    models,
    post_chat,
    sse_chunks,
    usage_counts,
)

READY_PROMPT = "Reply with exactly READY"
LENGTH_PROMPT = "Count from one to one hundred in words, separated by commas."
LENGTH_LIMIT = 5


def check_model_id(label: Label, server: Server) -> Check:
    def body() -> str:
        ids = [m.get("id") for m in models(server)]
        if server.model_id not in ids:
            raise CheckFailed(f"served ids {ids}")
        return server.model_id

    return guard(label, server.model_id, body)


def check_ready_answer(label: Label, server: Server) -> Check:
    def body() -> str:
        data = ask(server, READY_PROMPT, server.answer_budget(16))
        content = message_of(data).get("content")
        if not isinstance(content, str) or content.strip() != "READY":
            raise CheckFailed(f"answer {content!r}")
        return repr(content.strip())

    return guard(label, "'READY' (temperature 0)", body)


def check_usage(label: Label, server: Server) -> Check:
    def body() -> str:
        data = ask(server, READY_PROMPT, 16)
        content = message_of(data).get("content") or ""
        p, c, t = usage_counts(data)
        if p <= 0 or t != p + c:
            raise CheckFailed(f"prompt {p} + completion {c} != total {t}")
        if c < 1:
            raise CheckFailed(f"completion_tokens {c} for text {content!r}")
        return f"prompt {p} + completion {c} = total {t}"

    return guard(label, "prompt + completion = total, completion >= 1", body)


def check_length_limit(label: Label, server: Server) -> Check:
    def body() -> str:
        data = ask(server, LENGTH_PROMPT, LENGTH_LIMIT)
        reason = first_choice(data).get("finish_reason")
        _, completion, _ = usage_counts(data)
        if reason != "length" or completion != LENGTH_LIMIT:
            raise CheckFailed(f"finish_reason {reason!r}, completion_tokens {completion}")
        return f"finish_reason 'length', {completion} tokens"

    return guard(label, f"finish_reason 'length', {LENGTH_LIMIT} tokens", body)


def check_stream(label: Label, server: Server) -> Check:
    def body() -> str:
        arrivals: list[float] = []
        response = post_chat(server, LENGTH_PROMPT, 32, stream=True)
        try:
            for chunk in sse_chunks(server, response):
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if any(delta.get(k) for k in ("content", *REASONING_FIELDS)):
                        arrivals.append(time.monotonic())
        except StreamCut as err:
            raise CheckFailed(f"{err} after {len(arrivals)} text chunks") from err
        if len(arrivals) < 2:
            raise CheckFailed(f"{len(arrivals)} text chunk(s); not incremental")
        return f"{len(arrivals)} text chunks, then [DONE]"

    return guard(label, "incremental chunks ending in [DONE]", body)

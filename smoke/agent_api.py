"""Checks of what coding agents and chat clients call: reasoning kept out of the answer, tool
calls (whole and streamed), structured output, simultaneous requests, an image named, and a
needle brought back out of a long prompt.

Which checks apply comes from the profile: reasoning only where a reasoning parser runs, tool
calls only where a tool-call parser and auto tool choice are set, vision and long context where
its `smoke` section says the model can. A check that does not apply (or that `--skip` names) is
reported as skipped with the reason, never as passed. The prompts and the tool are constants the
CPU lane's model is trained on (docker/tiny_model.py), so on that server every check can pass
for real; on GLM-5.3 they are ordinary requests.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema

from smoke.api import READY_PROMPT
from smoke.check import Check, Label, guard
from smoke.client import (
    CheckFailed,
    Messages,
    Server,
    decode_json,
    exact_messages,
    message_of,
    post_json,
    reasoning_of,
    stream_chunks,
)

TOOL_PROMPT = "What is the weather in Paris right now?"
TOOL_CITY = "Paris"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
STRUCTURED_PROMPT = "Reply in JSON with the field answer set to READY"
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
DEFAULT_CONCURRENCY = 8
NEEDLE = "ORCHID-7319"
"""The code the seeds' runtime plants in its long-context check."""
NEEDLE_SENTENCE = f"The secret code for the vault is {NEEDLE}."
NEEDLE_QUESTION = "What is the secret code for the vault? Answer with the code only."
RED = (220, 20, 20)


def schema_problems(value: Any, schema: dict[str, Any]) -> list[str]:
    """What keeps `value` (a tool call's arguments, a JSON answer) from matching its JSON Schema,
    in jsonschema's words; empty when it matches."""
    validator = jsonschema.Draft202012Validator(schema)
    return [error.message for error in sorted(validator.iter_errors(value), key=str)]


def check_reasoning(label: Label, server: Server) -> Check:
    def body() -> str:
        data = decode_json(post_json(server, {
            "messages": [{"role": "user", "content": READY_PROMPT}],
            "max_tokens": server.answer_budget(16),
        }))  # fmt: skip
        message = message_of(data)
        thought, content = reasoning_of(message), message.get("content")
        if not thought:
            raise CheckFailed(f"no reasoning returned; content {content!r}")
        if not isinstance(content, str) or content.strip() != "READY":
            raise CheckFailed(f"content {content!r} (reasoning {len(thought)} chars)")
        return f"reasoning {len(thought)} chars, content 'READY'"

    return guard(label, "reasoning non-empty, content 'READY'", body)


def _tool_request(server: Server, stream: bool) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": TOOL_PROMPT}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "max_tokens": server.answer_budget(512),
        **({"stream": True} if stream else {}),
    }


def _judge_call(name: str | None, arguments: str | None) -> dict[str, Any]:
    want = WEATHER_TOOL["function"]
    if name != want["name"]:
        raise CheckFailed(f"tool {name!r}, expected {want['name']!r}")
    try:
        args = json.loads(arguments or "")
    except ValueError as err:
        raise CheckFailed(f"arguments are not JSON: {arguments!r}") from err
    problems = schema_problems(args, want["parameters"])
    if problems:
        raise CheckFailed(f"arguments {arguments} do not match the schema: {'; '.join(problems)}")
    return args


def tool_call(server: Server) -> tuple[str, dict[str, Any]]:
    """The first tool call of a non-streamed request, judged against the tool's schema."""
    data = decode_json(post_json(server, _tool_request(server, stream=False)))
    message = message_of(data)
    calls = message.get("tool_calls") or []
    if not calls:
        raise CheckFailed(f"no tool_calls; content {message.get('content')!r}")
    function = calls[0].get("function") or {}
    return function.get("name"), _judge_call(function.get("name"), function.get("arguments"))


def check_tool_call(label: Label, server: Server) -> Check:
    def body() -> str:
        name, args = tool_call(server)
        return f"{name}({json.dumps(args)})"

    return guard(label, "tool_calls with get_weather, arguments per schema", body)


def check_tool_call_stream(label: Label, server: Server) -> Check:
    def body() -> str:
        name, args = tool_call(server)
        streamed_name, pieces = None, []
        for chunk in stream_chunks(server, _tool_request(server, stream=True)):
            for choice in chunk.get("choices") or []:
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    if call.get("index", 0) != 0:
                        continue
                    function = call.get("function") or {}
                    streamed_name = function.get("name") or streamed_name
                    pieces.append(function.get("arguments") or "")
        streamed = _judge_call(streamed_name, "".join(pieces))
        if streamed != args:
            raise CheckFailed(f"streamed {json.dumps(streamed)}, whole {json.dumps(args)}")
        return f"{len(pieces)} argument deltas reassemble to {name}({json.dumps(streamed)})"

    return guard(label, "deltas reassemble to the same call", body)


def check_structured_output(label: Label, server: Server) -> Check:
    def body() -> str:
        data = decode_json(post_json(server, {
            "messages": [{"role": "user", "content": STRUCTURED_PROMPT}],
            "max_tokens": server.answer_budget(64),
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}},
        }, thinking_off=True))  # fmt: skip
        content = message_of(data).get("content")
        try:
            value = json.loads(content or "")
        except ValueError as err:
            raise CheckFailed(f"content is not JSON: {content!r}") from err
        problems = schema_problems(value, ANSWER_SCHEMA)
        if problems:
            raise CheckFailed(f"{content} does not match the schema: {'; '.join(problems)}")
        return content.strip()

    return guard(label, "JSON matching the response_format schema", body)


def check_concurrency(label: Label, server: Server, n: int = DEFAULT_CONCURRENCY) -> Check:
    def one(_: int) -> str:
        data = decode_json(post_json(server, {
            "messages": [{"role": "user", "content": READY_PROMPT}],
            "max_tokens": server.answer_budget(16),
        }, thinking_off=True))  # fmt: skip
        return str(message_of(data).get("content") or "").strip()

    def body() -> str:
        with ThreadPoolExecutor(max_workers=n) as pool:
            answers = list(pool.map(one, range(n)))
        wrong = [(i, a) for i, a in enumerate(answers) if a != "READY"]
        if wrong:
            raise CheckFailed(f"{len(wrong)} of {n} answered otherwise: {wrong[:3]}")
        return f"{n} of {n} answered 'READY'"

    return guard(label, f"all {n} answer 'READY'", body)


def png(colour: tuple[int, int, int], size: int = 64) -> bytes:
    """A single-colour RGB PNG, made in memory (no imaging library)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    row = b"\x00" + bytes(colour) * size
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(row * size)) + chunk(b"IEND", b""))  # fmt: skip


def check_vision(label: Label, server: Server) -> Check:
    def body() -> str:
        url = "data:image/png;base64," + base64.b64encode(png(RED)).decode()
        data = decode_json(post_json(server, {
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What colour is this image? Answer with one word."},
                {"type": "image_url", "image_url": {"url": url}},
            ]}],
            "max_tokens": server.answer_budget(16),
        }, thinking_off=True))  # fmt: skip
        content = str(message_of(data).get("content") or "").strip()
        if "red" not in content.lower():
            raise CheckFailed(f"answer {content!r} for a red image")
        return repr(content)

    return guard(label, "a red PNG is named 'Red'", body)


def needle_prompt(server: Server, tokens: int, depth: float) -> Messages:
    """Messages of exactly `tokens` tokens: filler with the needle at `depth` (at a sentence
    boundary), then the question."""

    def messages(filler: str) -> Messages:
        cut = int(len(filler) * depth)
        cut = filler.rfind(". ", 0, cut) + 2 if ". " in filler[:cut] else 0
        text = f"{filler[:cut]}{NEEDLE_SENTENCE} {filler[cut:]}\n\n{NEEDLE_QUESTION}"
        return [{"role": "user", "content": text}]

    return exact_messages(server, tokens, messages)


def check_long_context(label: Label, server: Server, tokens: int, depth: float) -> Check:
    def body() -> str:
        messages = needle_prompt(server, tokens, depth)
        data = decode_json(post_json(server, {"messages": messages,
                                         "max_tokens": server.answer_budget(32)},
                                thinking_off=True))  # fmt: skip
        prompt_tokens = (data.get("usage") or {}).get("prompt_tokens")
        if prompt_tokens != tokens:
            raise CheckFailed(f"server counted {prompt_tokens} prompt tokens, not {tokens}")
        content = str(message_of(data).get("content") or "").strip()
        if NEEDLE not in content:
            raise CheckFailed(f"answer {content[:60]!r}, the needle was {NEEDLE}")
        return f"{NEEDLE} back from {tokens:,} tokens"

    return guard(label, f"{NEEDLE} at depth {depth:g}", body)

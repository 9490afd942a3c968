"""Tool-call edge cases GLM-5.x users hit through vLLM's GLM parsers, each a named check.

- A tool that takes no arguments, called whole and streamed: vllm-project/vllm#44326 (glm47's
  streaming dropped zero-argument calls).
- A streamed request that sends no tools to a server with auto tool choice:
  local-inference-lab/vllm#29 (the tool parser re-emitted plain content, duplicating fragments).
- Reasoning followed by a tool call, whole and streamed: the call must arrive in `tool_calls`
  and none of GLM's markup in `content` or `reasoning` (vllm-project/vllm#46040, a
  `<tool_call>` left inside the thinking).

The prompts and the tool are constants the CPU lane's model is trained on
(docker/tiny_model.py), so vLLM's own glm45/glm47 parsers run on them there.
"""

from __future__ import annotations

import json
from typing import Any

from smoke.api import READY_PROMPT
from smoke.check import Check, Label, guard
from smoke.client import (
    CheckFailed,
    Server,
    decode_json,
    message_of,
    post_json,
    reasoning_of,
    stream_chunks,
)

GLM_MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
              "<arg_value>", "</arg_value>")  # fmt: skip
"""GLM's reasoning and tool-call tags: what a parser must take out of the text it returns."""
TIME_PROMPT = "What time is it now?"
TIME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time (UTC).",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


def markup_in(text: str | None) -> list[str]:
    return [tag for tag in GLM_MARKUP if text and tag in text]


def _request(server: Server, prompt: str, tools: list[dict[str, Any]], stream: bool,
             budget: int = 512) -> dict[str, Any]:  # fmt: skip
    return {
        "messages": [{"role": "user", "content": prompt}],
        **({"tools": tools, "tool_choice": "auto"} if tools else {}),
        "max_tokens": server.answer_budget(budget),
        **({"stream": True} if stream else {}),
    }


def whole(server: Server, prompt: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The message of a non-streamed request."""
    return message_of(decode_json(post_json(server, _request(server, prompt, tools, False))))


def streamed(server: Server, prompt: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed request reassembled as a message: content and reasoning joined, tool calls
    by index (name from the first delta that has one, arguments concatenated)."""
    content, reasoning, calls = [], [], {}
    for chunk in stream_chunks(server, _request(server, prompt, tools, True)):
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(reasoning_of(delta) or "")
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call.get("index", 0), {"name": None, "arguments": ""})
                function = call.get("function") or {}
                slot["name"] = slot["name"] or function.get("name")
                slot["arguments"] += function.get("arguments") or ""
    return {
        "content": "".join(content) or None,
        "reasoning": "".join(reasoning) or None,
        "tool_calls": [{"function": calls[i]} for i in sorted(calls)],
    }


def only_call(message: dict[str, Any], name: str) -> dict[str, Any]:
    """The message's single call of tool `name`, its arguments decoded; no markup left in the
    text around it."""
    calls = message.get("tool_calls") or []
    left = {"content": markup_in(message.get("content")),
            "reasoning": markup_in(reasoning_of(message))}  # fmt: skip
    if not calls:
        where = [f"{k} holds {tags}" for k, tags in left.items() if tags]
        raise CheckFailed(f"no tool_calls; content {message.get('content')!r}"
                          + (f" ({'; '.join(where)})" if where else ""))  # fmt: skip
    function = calls[0].get("function") or {}
    if len(calls) != 1 or function.get("name") != name:
        raise CheckFailed(f"calls {[(c.get('function') or {}).get('name') for c in calls]}, "
                          f"expected one {name!r}")  # fmt: skip
    for key, tags in left.items():
        if tags:
            raise CheckFailed(f"the call came back, but {key} still holds {tags}")
    raw = function.get("arguments")
    try:
        args = json.loads(raw)
    except (TypeError, ValueError) as err:
        raise CheckFailed(f"arguments {raw!r} are not a JSON object") from err
    if not isinstance(args, dict):
        raise CheckFailed(f"arguments {raw!r} are not a JSON object")
    return args


def check_noarg_call(label: Label, server: Server) -> Check:
    def body() -> str:
        args = only_call(whole(server, TIME_PROMPT, [TIME_TOOL]), "get_time")
        if args:
            raise CheckFailed(f"get_time takes no arguments, got {json.dumps(args)}")
        return "get_time({})"

    return guard(label, "get_time with arguments {}", body)


def check_noarg_call_stream(label: Label, server: Server) -> Check:
    def body() -> str:
        message = streamed(server, TIME_PROMPT, [TIME_TOOL])
        args = only_call(message, "get_time")
        if args:
            raise CheckFailed(f"get_time takes no arguments, streamed {json.dumps(args)}")
        return "get_time({}) from the deltas"

    return guard(label, "deltas name get_time, arguments {}", body)


def check_stream_without_tools(label: Label, server: Server) -> Check:
    def body() -> str:
        want = whole(server, READY_PROMPT, [])
        got = streamed(server, READY_PROMPT, [])
        if got["tool_calls"]:
            raise CheckFailed(f"tool_calls deltas in a request with no tools: {got['tool_calls']}")
        for key, text in (("content", got["content"]), ("reasoning", got["reasoning"])):
            if markup_in(text):
                raise CheckFailed(f"streamed {key} holds {markup_in(text)}: {text!r}")
        if (got["content"] or "").strip() != "READY":
            raise CheckFailed(f"streamed content {got['content']!r}; whole {want.get('content')!r}")
        return f"content 'READY', reasoning {len(got['reasoning'] or '')} chars, no tool deltas"

    return guard(label, "the same 'READY', no markup", body)


def check_reasoning_then_call(label: Label, server: Server, prompt: str,
                              tool: dict[str, Any]) -> Check:  # fmt: skip
    """`prompt` makes the model think, then call `tool` (the weather check's request)."""
    name = tool["function"]["name"]

    def body() -> str:
        shown = []
        for how, message in (("whole", whole(server, prompt, [tool])),
                             ("streamed", streamed(server, prompt, [tool]))):  # fmt: skip
            thought = reasoning_of(message)
            if not thought:
                raise CheckFailed(f"{how}: no reasoning before the call")
            only_call(message, name)
            if (message.get("content") or "").strip():
                raise CheckFailed(f"{how}: content {message['content']!r} beside the call")
            shown.append(f"{how}: reasoning {len(thought)} chars, then {name}")
        return "; ".join(shown)

    return guard(label, "reasoning, then the call in tool_calls, no markup in either", body)

"""A test double that speaks vLLM's OpenAI wire format on 127.0.0.1, healthy or faulty.

It is never shipped as the kit's server. Faults: `http500`, `hang` (never answers chat),
`cut_stream` (stream stops before [DONE]), `malformed` (invalid JSON), `wrong_model`, `empty`
(empty answer), `late` (503 on /health until `late_seconds` have passed), `no_length` (ignores
max_tokens), and the ones the agent-API checks must catch: `leak_thinking` (the thinking stays in
`content`), `no_tool_calls` (a tool request answered as text), `bad_json` (structured output that
is not JSON), `one_wrong` (every fifth direct READY answer is wrong), `wrong_needle` (answers
another code than the one planted), `blind` (names the wrong colour), and the GLM breakages users
reported: `drop_noarg_stream` (a streamed zero-argument call is dropped, vllm-project/vllm#44326),
`dup_no_tools_stream` (a no-tools stream repeats a content fragment, local-inference-lab/vllm#29),
`markup_in_reasoning` (the call is parsed but its markup stays in the reasoning,
vllm-project/vllm#46040), `no_prefix_hits` (prefix caching silently dead,
local-inference-lab/vllm#545), `low_acceptance` (drafts accepted at a collapsed rate,
local-inference-lab/vllm#513). Healthy, it answers as a
GLM server with reasoning and tool parsers does (`reasoning`, `tool_calls`, streamed deltas),
reads a planted needle back, and counts tokens as one per word plus the template's 8
(`/tokenize` and usage agree). Its `/metrics` are vLLM's counter names written by
prometheus_client (what vLLM exposes them with): prefix-cache queries and hits (a repeated prompt
hits all its full 16-token blocks but the last token's) and, with `spec_length`, the speculative
draft/accepted counters at that mean acceptance length.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

MODEL = "GLM-5.3-Flash"
"""The GLM profiles' served model name (what /v1/models reports)."""
WORDS = ["one", ",", " two", ",", " three", ",", " four", ",", " five", ",", " six"]
THOUGHT = "One word is asked for."
NEEDLE_RE = re.compile(r"The secret code for the vault is (\S+?)\.")
TEMPLATE_TOKENS = 8


def count(messages: list[dict[str, Any]]) -> int:
    """Tokens of a chat prompt: one per whitespace-separated word, plus the template's 8."""
    text = " ".join(str(m.get("content", "")) for m in messages)
    return TEMPLATE_TOKENS + len(text.split())
CALL_ARGS = ['{"city": ', '"Paris"}']
WEATHER_MARKUP = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
                  "</tool_call>")
BLOCK = 16
"""The stand-in's prefix-cache block (vLLM's default on CUDA)."""
LABELS = {"engine": "0", "model_name": MODEL}


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, fault: str | None = None, late_seconds: float = 0.0, model: str = MODEL,
        max_model_len: int = 8192, spec_length: float | None = 2.4,
    ) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.fault = fault
        self.max_model_len = max_model_len
        self.model = model if fault != "wrong_model" else "some-other-model"
        self.ready_at = time.monotonic() + (late_seconds if fault == "late" else 0.0)
        self.release = threading.Event()
        self.chat_requests = 0
        self.chat_bodies: list[dict[str, Any]] = []
        self.direct_ready = 0
        self.seen_prompts: set[str] = set()
        self.spec_length = (1.9 if fault == "low_acceptance" else spec_length)
        self.registry = CollectorRegistry()
        names = {"queries": "vllm:prefix_cache_queries", "hits": "vllm:prefix_cache_hits"}
        if self.spec_length is not None:
            names |= {"drafts": "vllm:spec_decode_num_drafts",
                      "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                      "accepted": "vllm:spec_decode_num_accepted_tokens"}  # fmt: skip
        self.counters = {key: Counter(name, name, list(LABELS), registry=self.registry)
                         for key, name in names.items()}  # fmt: skip
        for counter in self.counters.values():  # vLLM creates each engine's series at start
            counter.labels(**LABELS)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def account(self, request: dict[str, Any]) -> None:
        """What a vLLM engine would count for this request: prefix lookups and hits, and (when
        speculating) ten draft rounds of three tokens at `spec_length`."""
        text = json.dumps(request.get("messages"))
        prompt = count(request.get("messages") or [])
        self.counters["queries"].labels(**LABELS).inc(prompt)
        if text in self.seen_prompts and self.fault != "no_prefix_hits":
            self.counters["hits"].labels(**LABELS).inc((prompt - 1) // BLOCK * BLOCK)
        self.seen_prompts.add(text)
        if self.spec_length is not None:
            self.counters["drafts"].labels(**LABELS).inc(10)
            self.counters["draft_tokens"].labels(**LABELS).inc(30)
            self.counters["accepted"].labels(**LABELS).inc(round(10 * (self.spec_length - 1)))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)


class Handler(BaseHTTPRequestHandler):
    server: StandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if time.monotonic() < self.server.ready_at:
            self._send(503, b'{"error": "loading"}')
        elif self.path == "/health":
            self._send(200, b"")
        elif self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": self.server.model, "object": "model",
                                                "max_model_len": self.server.max_model_len}]}
            self._send(200, json.dumps(body).encode())
        elif self.path == "/metrics":
            self._send(200, generate_latest(self.server.registry), "text/plain; version=0.0.4")
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        self.server.chat_requests += 1
        length = int(self.headers.get("Content-Length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path == "/tokenize":
            self._send(200, json.dumps({"count": count(request["messages"])}).encode())
            return
        self.server.chat_bodies.append(request)
        self.server.account(request)
        asked, context = request.get("max_tokens"), self.server.max_model_len
        if isinstance(asked, int) and asked > context:
            # vLLM's own refusal (vllm/renderers/params.py in 0.33.0), as a real server with
            # --max-model-len 512 answers a 2,048-token request
            message = (f"max_tokens={asked} cannot be greater than max_model_len={context}. "
                       "Please request fewer output tokens.")  # fmt: skip
            self._send(400, json.dumps({"error": {"message": message, "code": 400}}).encode())
            return
        fault = self.server.fault
        if fault == "http500":
            self._send(500, b'{"error": "internal"}')
            return
        if fault == "hang":
            self.server.release.wait(timeout=30)
            return
        if fault == "malformed":
            self._send(200, b'{"choices": [')
            return
        prompt = request["messages"][-1]["content"]
        if not isinstance(prompt, str):  # text and image parts
            colour = "Blue" if fault == "blind" else "Red"
            self._answer(request, colour if any(p.get("type") == "image_url" for p in prompt)
                         else "no image")  # fmt: skip
            return
        if (needle := NEEDLE_RE.search(prompt)) is not None:
            self._answer(request, "ORCHID-0000" if fault == "wrong_needle" else needle.group(1))
            return
        if request.get("stream"):
            self._stream(request)
            return
        max_tokens = request.get("max_tokens") or 16
        ready = [] if fault == "empty" else ["READY"]
        tokens = ready if "READY" in prompt else WORDS
        limited = fault != "no_length" and len(tokens) > max_tokens
        tokens = tokens[:max_tokens] if limited else tokens
        message: dict[str, Any] = {"role": "assistant", "content": "".join(tokens)}
        thinking = (request.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        if request.get("tools") and fault != "no_tool_calls":
            name, args = tool_and_arguments(request)
            markup = fault == "markup_in_reasoning" and name == "get_weather"
            thought = THOUGHT + (WEATHER_MARKUP if markup else "")
            message = {"role": "assistant", "content": None, "reasoning": thought,
                       "tool_calls": [{"id": "call-0", "type": "function", "function": {
                           "name": name, "arguments": args}}]}  # fmt: skip
        elif request.get("response_format"):
            message["content"] = '{"answer": READY' if fault == "bad_json" else (
                '{"answer": "READY"}')  # fmt: skip
        elif tokens == ["READY"] and thinking:
            leaked = fault == "leak_thinking"
            message = {"role": "assistant",
                       "content": f"<think>{THOUGHT}</think>READY" if leaked else "READY",
                       "reasoning": None if leaked else THOUGHT}  # fmt: skip
        elif tokens == ["READY"]:
            self.server.direct_ready += 1
            if fault == "one_wrong" and self.server.direct_ready % 5 == 0:
                message["content"] = "READ"
        body = {
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "model": self.server.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "length" if limited else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": len(tokens),
                "total_tokens": 12 + len(tokens),
            },
        }
        self._send(200, json.dumps(body).encode())

    def _answer(self, request: dict[str, Any], text: str) -> None:
        prompt = count(request["messages"])
        self._send(200, json.dumps({
            "id": "chatcmpl-standin", "object": "chat.completion", "model": self.server.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 1,
                      "total_tokens": prompt + 1},
        }).encode())  # fmt: skip

    def _stream(self, request: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        fault = self.server.fault
        tokens = WORDS[: request.get("max_tokens") or 16]
        deltas: list[dict[str, Any]] = [{"content": token} for token in tokens]
        thinking = (request.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        if request.get("tools") and fault != "no_tool_calls":
            name, args = tool_and_arguments(request)
            markup = fault == "markup_in_reasoning" and name == "get_weather"
            thought = THOUGHT + (WEATHER_MARKUP if markup else "")
            first = {"index": 0, "id": "call-0", "type": "function",
                     "function": {"name": name, "arguments": "" if args != "{}" else args}}
            pieces = CALL_ARGS if args != "{}" else []
            deltas = [{"reasoning": thought}, {"tool_calls": [first]}] + [
                {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                for piece in pieces
            ]  # fmt: skip
            if name == "get_time" and fault == "drop_noarg_stream":
                deltas = [{"reasoning": thought}]
        elif "READY" in request["messages"][-1]["content"]:
            tokens = ["RE", "ADY"]
            deltas = [{"content": token} for token in tokens]
            if fault == "dup_no_tools_stream":
                deltas.insert(1, {"content": "RE"})
            if thinking:
                deltas.insert(0, {"reasoning": THOUGHT})
        for i, delta in enumerate(deltas):
            if self.server.fault == "cut_stream" and i == 3:
                self.wfile.flush()
                self.close_connection = True
                return
            chunk = {"choices": [{"index": 0, "delta": delta}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.01)
        usage = {
            "choices": [],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": len(tokens),
                "total_tokens": 12 + len(tokens),
            },
        }
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


def tool_and_arguments(request: dict[str, Any]) -> tuple[str, str]:
    """The call the stand-in makes for a tool request: get_weather(city) or get_time()."""
    name = request["tools"][0]["function"]["name"]
    return name, "{}" if name == "get_time" else "".join(CALL_ARGS)

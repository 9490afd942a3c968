"""A fast stand-in for vLLM's OpenAI server on 127.0.0.1, for the bench and its tests.

A test double, never shipped as the kit's server. Streaming responses are pre-built byte blobs
(HTTP/1.1 chunked, one chunk per SSE event, as uvicorn sends them) written as fast as the socket
allows, so the client under test is the bottleneck. It also serves `/v1/models`, `/health`,
`/tokenize` (one token per whitespace-separated word, plus the chat template's 8) and Prometheus
`/metrics` with spec-decode counters that grow by known amounts per completed request, and
prefix-cache counters from a whole-prompt LRU "GPU cache" (`--cache-tokens`) whose evictions can
fall into a "host tier" (`--host-tier-tokens`): a model of what vLLM's counters show, for the
bench's prefix-reuse cell (the real CPU build has no host tier to show it with).

    python tests/standin_fast.py --port 0      # prints "listening on PORT", serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections import OrderedDict
from dataclasses import dataclass, field

MODEL = "GLM-5.3-Flash"
TEMPLATE_TOKENS = 8
# Per completed streaming request: drafts and accepted tokens such that the mean acceptance
# length 1 + accepted / drafts is exactly 2.5 (3 of 4 drafted tokens accepted per 2 drafts).
DRAFTS_PER_REQUEST = 2
DRAFT_TOKENS_PER_REQUEST = 8
ACCEPTED_PER_REQUEST = 3


def count_tokens(messages: list[dict]) -> int:
    return TEMPLATE_TOKENS + sum(len(str(m.get("content", "")).split()) for m in messages)


def completion_text(prompt_tokens: int, max_tokens: int, variant: str) -> list[str]:
    """Deterministic tokens for a prompt size; `variant` changes exactly one token."""
    words = [f" w{(prompt_tokens * 31 + i * 7) % 997}" for i in range(max_tokens)]
    if variant and words:
        words[len(words) // 2] = f" {variant}"
    return words


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


@dataclass
class Counters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    requests: int = 0
    prefix_hits: int = 0
    external_hits: int = 0


@dataclass
class PrefixCache:
    """Whole prompts by recency, up to `gpu_tokens`; what falls out goes to a host tier of
    `host_tokens` (0: dropped)."""

    gpu_tokens: int = 0
    host_tokens: int = 0
    gpu: OrderedDict[str, int] = field(default_factory=OrderedDict)
    host: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def lookup(self, prompt: str, tokens: int, counters: Counters) -> None:
        if prompt in self.gpu:
            counters.prefix_hits += tokens
        elif prompt in self.host:
            counters.external_hits += tokens
        self.gpu[prompt] = tokens
        self.gpu.move_to_end(prompt)
        self.host.pop(prompt, None)
        while sum(self.gpu.values()) > self.gpu_tokens and self.gpu:
            old, size = self.gpu.popitem(last=False)
            if self.host_tokens:
                self.host[old] = size
        while sum(self.host.values()) > self.host_tokens and self.host:
            self.host.popitem(last=False)


@dataclass
class StandIn:
    model: str = MODEL
    variant: str = ""
    fail_every: int = 0  # every Nth chat request answers HTTP 500
    metrics_delay: float = 0.0  # seconds each /metrics answer waits (a loaded server's read)
    leak_kib: int = 0  # KiB each chat request keeps for good: a real leak, for the soak's bound
    _leaked: list[bytearray] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    cache: PrefixCache = field(default_factory=PrefixCache)
    _blobs: dict[tuple[int, int, bool], bytes] = field(default_factory=dict)
    _seen: int = 0

    def stream_blob(self, prompt_tokens: int, max_tokens: int, continuous: bool) -> bytes:
        key = (prompt_tokens, max_tokens, continuous)
        blob = self._blobs.get(key)
        if blob is None:
            parts = []
            words = completion_text(prompt_tokens, max_tokens, self.variant)
            for i, word in enumerate(words, start=1):
                event = {
                    "id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": 0,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
                }  # fmt: skip
                if continuous:
                    event["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": i,
                                      "total_tokens": prompt_tokens + i}  # fmt: skip
                parts.append(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
            final = {
                "id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": 0,
                "model": self.model, "choices": [],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                          "total_tokens": prompt_tokens + len(words)},
            }  # fmt: skip
            parts.append(_chunk(b"data: " + json.dumps(final).encode() + b"\n\n"))
            parts.append(_chunk(b"data: [DONE]\n\n"))
            parts.append(b"0\r\n\r\n")
            blob = b"".join(parts)
            self._blobs[key] = blob
        return blob

    def metrics(self) -> bytes:
        c = self.counters
        labels = f'{{engine="0",model_name="{self.model}"}}'
        lines = []
        for name, value in (("drafts", c.drafts), ("draft_tokens", c.draft_tokens),
                            ("accepted_tokens", c.accepted)):  # fmt: skip
            lines += [f"# TYPE vllm:spec_decode_num_{name}_total counter",
                      f"vllm:spec_decode_num_{name}_total{labels} {value}.0"]  # fmt: skip
        for name, value in (("prefix_cache_hits", c.prefix_hits),
                            ("external_prefix_cache_hits", c.external_hits)):  # fmt: skip
            lines += [f"# TYPE vllm:{name}_total counter", f"vllm:{name}_total{labels} {value}.0"]
        # prometheus_client's process collector, as in vLLM's /metrics: this process's own RSS
        resident_pages = int(open("/proc/self/statm").read().split()[1])  # noqa: SIM115
        lines += ["# TYPE process_resident_memory_bytes gauge",
                  f"process_resident_memory_bytes {resident_pages * os.sysconf('SC_PAGE_SIZE')}.0"]
        return ("\n".join(lines) + "\n").encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers = {k.lower(): v.strip() for k, _, v in
                           (h.partition(":") for h in header_lines if h)}  # fmt: skip
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                keep = await self.route(method, path, body, writer)
                await writer.drain()
                if not keep or headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _json(self, writer: asyncio.StreamWriter, status: int, payload: object) -> bool:
        data = json.dumps(payload).encode()
        reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}[status]
        writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d"
                     b"\r\n\r\n%s" % (status, reason.encode(), len(data), data))  # fmt: skip
        return True

    async def route(
        self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter
    ) -> bool:
        if method == "GET" and path == "/health":
            return self._json(writer, 200, {})
        if method == "GET" and path == "/v1/models":
            return self._json(writer, 200, {"object": "list", "data": [{"id": self.model}]})
        if method == "GET" and path == "/metrics":
            await asyncio.sleep(self.metrics_delay)
            data = self.metrics()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d"
                         b"\r\n\r\n%s" % (len(data), data))  # fmt: skip
            return True
        request = json.loads(body or b"{}")
        if method == "POST" and path == "/tokenize":
            messages = request.get("messages") or [{"content": request.get("prompt", "")}]
            return self._json(
                writer, 200, {"count": count_tokens(messages), "max_model_len": 10**6}
            )
        if method != "POST" or path != "/v1/chat/completions":
            return self._json(writer, 404, {"error": "not found"})
        self._seen += 1
        if self.leak_kib:
            self._leaked.append(bytearray(b"x" * (self.leak_kib << 10)))
        if self.fail_every and self._seen % self.fail_every == 0:
            return self._json(writer, 500, {"error": "injected failure"})
        prompt_tokens = count_tokens(request.get("messages", []))
        prompt = json.dumps(request.get("messages", []))
        self.cache.lookup(prompt, prompt_tokens, self.counters)
        max_tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
        if request.get("stream"):
            options = request.get("stream_options") or {}
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
            writer.write(self.stream_blob(prompt_tokens, max_tokens,
                                          bool(options.get("continuous_usage_stats"))))  # fmt: skip
        else:
            words = completion_text(prompt_tokens, max_tokens, self.variant)
            self._json(writer, 200, {
                "id": "chatcmpl-standin", "object": "chat.completion", "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant",
                                                     "content": "".join(words)},
                             "finish_reason": "length"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                          "total_tokens": prompt_tokens + len(words)},
            })  # fmt: skip
        c = self.counters
        c.requests += 1
        c.drafts += DRAFTS_PER_REQUEST
        c.draft_tokens += DRAFT_TOKENS_PER_REQUEST
        c.accepted += ACCEPTED_PER_REQUEST
        return True


async def serve(standin: StandIn, port: int, ready: asyncio.Future | None = None) -> None:
    server = await asyncio.start_server(standin.handle, "127.0.0.1", port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set_result(bound)
    else:
        print(f"listening on {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--variant", default="", help="change one generated token")
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--cache-tokens", type=int, default=0, help="prefix cache size")
    parser.add_argument("--host-tier-tokens", type=int, default=0, help="host tier size")
    parser.add_argument("--metrics-delay", type=float, default=0.0, help="slow /metrics reads")
    parser.add_argument("--leak-kib", type=int, default=0, help="KiB kept per chat request")
    args = parser.parse_args()
    cache = PrefixCache(args.cache_tokens, args.host_tier_tokens)
    standin = StandIn(
        variant=args.variant,
        fail_every=args.fail_every,
        cache=cache,
        metrics_delay=args.metrics_delay,
        leak_kib=args.leak_kib,
    )
    asyncio.run(serve(standin, args.port))


if __name__ == "__main__":
    main()

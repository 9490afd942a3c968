"""A test double that speaks vLLM's OpenAI wire format on 127.0.0.1, healthy or faulty.

It is never shipped as the kit's server. Faults: `http500`, `hang` (never answers chat),
`cut_stream` (stream stops before [DONE]), `malformed` (invalid JSON), `wrong_model`, `empty`
(empty answer), `late` (503 on /health until `late_seconds` have passed), `no_length` (ignores
max_tokens).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "local-inference-lab/GLM-5.3-Flash-NVFP4"
WORDS = ["one", ",", " two", ",", " three", ",", " four", ",", " five", ",", " six"]


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, fault: str | None = None, late_seconds: float = 0.0, model: str = MODEL
    ) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.fault = fault
        self.model = model if fault != "wrong_model" else "some-other-model"
        self.ready_at = time.monotonic() + (late_seconds if fault == "late" else 0.0)
        self.release = threading.Event()
        self.chat_requests = 0
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

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
            body = {"object": "list", "data": [{"id": self.server.model, "object": "model"}]}
            self._send(200, json.dumps(body).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self) -> None:
        self.server.chat_requests += 1
        length = int(self.headers.get("Content-Length", "0"))
        request = json.loads(self.rfile.read(length) or b"{}")
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
        if request.get("stream"):
            self._stream(request)
            return
        max_tokens = request.get("max_tokens") or 16
        ready = [] if fault == "empty" else ["READY"]
        tokens = ready if "READY" in prompt else WORDS
        limited = fault != "no_length" and len(tokens) > max_tokens
        tokens = tokens[:max_tokens] if limited else tokens
        body = {
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "model": self.server.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(tokens)},
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

    def _stream(self, request: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        tokens = WORDS[: request.get("max_tokens") or 16]
        for i, token in enumerate(tokens):
            if self.server.fault == "cut_stream" and i == 3:
                self.wfile.flush()
                self.close_connection = True
                return
            chunk = {"choices": [{"index": 0, "delta": {"content": token}}]}
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

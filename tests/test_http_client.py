"""The kit's synchronous HTTP client (smoke/client.py) holding many streams open at once, as the
e2e's dropped-streams step and a large `check_concurrency` do."""

from __future__ import annotations

import socket
import threading

from smoke.client import Server, send

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n")  # fmt: skip


def holding_server() -> tuple[socket.socket, int, list[socket.socket]]:
    """A STAND-IN for a server mid-generation: it answers every request with a stream's head
    and first chunk, then holds the connection open (a real engine cannot be made to hold
    more than its slots here)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(HEAD)
            held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1], held


def test_more_streams_than_a_default_pool_holds_stay_open_at_once():
    listener, port, held = holding_server()
    server = Server(f"http://127.0.0.1:{port}", "m", timeout=3)
    try:
        responses = [send(server, "POST", "/v1/chat/completions", body={"stream": True},
                          stream=True) for _ in range(120)]  # fmt: skip
        assert [r.status_code for r in responses] == [200] * 120
        for response in responses:
            response.close()
    finally:
        listener.close()
        for conn in held:
            conn.close()

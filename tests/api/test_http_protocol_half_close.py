"""service/api/http_protocol.py: a client's half-close (shutdown(SHUT_WR)) is its leaving.

Pinned, not fixed: a client that half-closes after its request gets no answer, as with uvicorn (and
nginx in front of an app: its `proxy_ignore_client_abort` is off by default). At the TCP level a
half-close and a close are the same FIN, and a client that gives up (its timeout, a crawler cancelling)
closes far more often than one half-closes to wait; the request's app is told that its client left, and
an embedding's work is cancelled, its queued documents skipped (service.api.runtime). Keeping such a
connection half-open to answer would run every abandoned request to its end instead.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from tests.api.protocol_harness import threaded_server

# Far below the keep-alive timeout the server is given: a close within it is the half-close's.
_PROMPT_S = 5.0


def test_a_half_close_tells_the_running_request_that_its_client_left_and_closes() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/work":
            seen.append((await receive())["type"])
            seen.append((await receive())["type"])  # what comes after the (empty) body
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with threaded_server(app, timeout_keep_alive=60) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=_PROMPT_S) as sock:
            sock.sendall(b"GET /work HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(65536) == b""
        for _ in range(200):  # (the app's task runs on the server's loop)
            if len(seen) == 2:
                break
            time.sleep(0.01)
        assert seen == ["http.request", "http.disconnect"]

        # Idle after an answer, a half-close closes the connection at once (not at the keep-alive's end).
        with socket.create_connection(("127.0.0.1", port), timeout=_PROMPT_S) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok"):
                answer += sock.recv(65536)
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(65536) == b""

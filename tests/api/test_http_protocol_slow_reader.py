"""service/api/http_protocol.py: a steady but slow reader of large pipelined answers keeps its connection.

The write timer (`head_timeout_s`) aborts a connection whose client reads none of its answers. It measured
progress in the transport's own buffer only, which drains only when the kernel's send buffer frees a large
share of itself: a client reading through a small receive window, steadily, was aborted before its last
answers (40 pipelined `/openapi.json`, read 32 KB each 0.1 s, cut off after 27 s with
HTMLLM_HEAD_TIMEOUT_S=30). Bytes the kernel sent (its send queue shrinking, SIOCOUTQ) now count as read.
"""

from __future__ import annotations

import socket
import sys
import time
from typing import Any

import pytest

from tests.api.protocol_harness import threaded_server

# The reproduction's shape (a small receive window, 32 KB reads at a steady pace), faster: 30 reads of the
# client's in each head timeout of a second (a loaded test machine's stall of the reading thread is far
# shorter).
_HEAD_TIMEOUT_S = 1.0
_PACE_S = _HEAD_TIMEOUT_S / 30
_ANSWER = 87_555  # (the service's /openapi.json)
_REQUESTS = 40
_HEAD = b"HTTP/1.1 200 OK\r\n"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    headers = [(b"content-length", b"%d" % _ANSWER)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"x" * _ANSWER})


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the kernel's send queue is asked on Linux only")
def test_a_steady_slow_reader_of_pipelined_answers_gets_them_all() -> None:
    """The client's receive buffer is small and it reads at a steady pace, far slower than the server
    writes: every answer still arrives whole. (The pace is the premise, nothing is timed: a client slower
    still, from a busy machine, only makes the server's buffers drain slower.)"""
    with (
        threaded_server(_app, head_timeout_s=_HEAD_TIMEOUT_S) as port,
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client,
    ):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * _REQUESTS)
        client.settimeout(30)
        received = bytearray()
        expected = None  # (each answer's head is as long as the first's)
        while expected is None or len(received) < expected:
            time.sleep(_PACE_S)
            chunk = client.recv(32768)
            if not chunk:
                break
            received += chunk
            if expected is None and b"\r\n\r\n" in received:
                expected = _REQUESTS * (received.index(b"\r\n\r\n") + 4 + _ANSWER)
    answers = received.count(_HEAD)
    assert answers == _REQUESTS and len(received) == expected, f"cut off after {len(received)} bytes"

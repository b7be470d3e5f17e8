"""service/api/http_protocol.py: what the HTTP parser refuses is a JSON 400 with a machine-readable code.

Every other error of the service is `{"error": {"code", "message"}}`, its answers from below the app (the
431, the 408) too, but bytes llhttp refused (a malformed request line or header, a bad chunk size) got
uvicorn's plain-text "Invalid HTTP request received.". They are now the 400 `malformed_request`, with
llhttp's reason in the message (one of its fixed strings, never the client's bytes), still closing the
connection.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import pytest

from service.api.errors import STATUS
from service.core.errors import ErrorCode
from tests.api.protocol_harness import threaded_server

_CHUNKED = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_parsers_codes_have_their_statuses() -> None:
    assert STATUS[ErrorCode.MALFORMED_REQUEST] == 400
    assert STATUS[ErrorCode.UNSUPPORTED_TRANSFER_CODING] == 501


@pytest.mark.parametrize(
    ("request_bytes", "reason"),
    [
        (b"GET /a HTTP/1.1\r\nBad Name: 1\r\n\r\n", b"Invalid header token"),
        (b"G\x01T /a HTTP/1.1\r\n\r\n", b"Invalid method encountered"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64, b"Invalid method encountered"),
        (_CHUNKED + b"3\r\nabc\r\nzz\r\n", b"Invalid character in chunk size"),
        (
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nA\x7f: 1\r\n\r\n",
            b"Invalid header",
        ),
    ],
    ids=["header-name", "method", "tls-on-the-plain-port", "chunk-size", "behind-a-pipelined-request"],
)
def test_what_the_parser_refuses_is_a_json_400_with_its_code(request_bytes: bytes, reason: bytes) -> None:
    with (
        threaded_server(_app, head_timeout_s=60.0) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock,
    ):
        sock.sendall(request_bytes)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    refusal = answer[answer.rindex(b"HTTP/1.1 400 ") :]
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)[-1:] == [b"400"], answer
    head, _, body = refusal.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), head
    assert b"content-type: application/json" in head and b"connection: close" in head and b"date: " in head
    assert b"content-length: %d" % len(body) in head, head
    error = json.loads(body)["error"]
    assert error["code"] == "malformed_request" and set(error) == {"code", "message"}, error
    assert error["message"].startswith("malformed HTTP/1.1 request: " + reason.decode()), error

"""service/api/http_protocol.py: a transfer coding other than chunked is refused, 501, never passed on.

llhttp decodes only the chunked coding: a request with `Transfer-Encoding: gzip, chunked` (or `gzip` and
`chunked` in two fields) was framed by its chunks and its body, still gzipped, reached the app as if it
were the page. RFC 9112 section 6.1: a server that receives a transfer coding it does not understand
should answer 501 (Not Implemented) and close the connection. Chunked alone is served as before; one
whose last coding is not chunked has no length that can be known, and stays a 400 (section 6.3).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket

import pytest

from tests.api.protocol_harness import echo_app, protocol_on_fake_transport, threaded_server
from tests.factories.waiting import until_async

_PAGE = b"<p>a page</p>"
# A request after the refused one, in the same write: nothing after a refusal is read as a request.
_AFTER = b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n"


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _request(transfer_encoding: bytes, body: bytes) -> bytes:
    head = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nContent-Type: text/html\r\n" + transfer_encoding
    return head + b"\r\n" + _chunked(body)


async def _exchange(data: bytes) -> tuple[bytes, bool]:
    protocol, transport = protocol_on_fake_transport(echo_app, head_timeout_s=60.0)
    protocol.data_received(data)
    await until_async(lambda: _statuses(transport.written), "an answer")
    await asyncio.sleep(0.01)  # (time for anything else to be answered)
    return transport.written, transport.closed


def _error(answer: bytes) -> dict[str, str]:
    error: dict[str, str] = json.loads(answer.rpartition(b"\r\n\r\n")[2])["error"]
    return error


@pytest.mark.parametrize(
    "transfer_encoding",
    [
        b"Transfer-Encoding: gzip, chunked\r\n",
        b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: deflate;level=1 , chunked\r\n",
        b"Transfer-Encoding: compress, gzip, chunked\r\n",
    ],
    ids=["gzip-chunked", "in-two-fields", "with-a-parameter", "two-codings"],
)
async def test_a_coding_before_chunked_is_a_501_and_nothing_after_it_read(transfer_encoding: bytes) -> None:
    answer, closed = await _exchange(_request(transfer_encoding, gzip.compress(_PAGE)) + _AFTER)
    assert _statuses(answer) == [b"501"] and closed, answer
    assert answer.startswith(b"HTTP/1.1 501 Not Implemented\r\n") and b"connection: close" in answer
    error = _error(answer)
    assert error["code"] == "unsupported_transfer_coding" and "only chunked" in error["message"], error


@pytest.mark.parametrize(
    "transfer_encoding",
    [
        b"Transfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: Chunked\r\n",
        b"Transfer-Encoding: , chunked\r\n",
    ],
    ids=["chunked", "its-case", "an-empty-element"],
)
async def test_chunked_alone_is_served(transfer_encoding: bytes) -> None:
    answer, closed = await _exchange(_request(transfer_encoding, _PAGE) + _AFTER)
    assert _statuses(answer) == [b"200", b"200"] and not closed, answer
    assert answer.split(b"\r\n\r\n")[1].startswith(_PAGE), answer


@pytest.mark.parametrize(
    "transfer_encoding",
    [
        b"Transfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: identity\r\n",
        b"Transfer-Encoding: chunked, gzip\r\n",
        b"Transfer-Encoding: chunked, chunked\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    ],
    ids=["gzip-alone", "identity", "chunked-first", "chunked-twice", "chunked-in-two-fields", "and-a-length"],
)
async def test_a_body_of_no_knowable_length_stays_a_400(transfer_encoding: bytes) -> None:
    """llhttp refuses these (their framing cannot be trusted: request smuggling), as before, now with the
    service's error body."""
    answer, closed = await _exchange(_request(transfer_encoding, _PAGE) + _AFTER)
    assert _statuses(answer) == [b"400"] and closed, answer
    assert _error(answer)["code"] == "malformed_request"


def test_a_gzip_transfer_coding_is_a_501_over_tcp() -> None:
    with (
        threaded_server(echo_app, head_timeout_s=60.0) as port,
        socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock,
    ):
        sock.sendall(_request(b"Transfer-Encoding: gzip, chunked\r\n", gzip.compress(_PAGE)) + _AFTER)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert _statuses(answer) == [b"501"] and _error(answer)["code"] == "unsupported_transfer_coding", answer


@pytest.mark.parametrize(
    "transfer_encoding",
    [
        b"Transfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 17\r\n",
        b"Transfer-Encoding: gzip, chunked\r\n",
        b"Transfer-Encoding: identity\r\n",
    ],
    ids=["chunked", "and-a-length", "gzip-chunked", "identity"],
)
async def test_any_transfer_encoding_in_http_1_0_is_a_400(transfer_encoding: bytes) -> None:
    """HTTP/1.0 has no transfer codings: RFC 9112 section 6.1 has a server treat such a request's framing
    as faulty, even beside a Content-Length. llhttp had framed it by its chunks and served it, 200."""
    request = _request(transfer_encoding, _PAGE).replace(b" HTTP/1.1\r\n", b" HTTP/1.0\r\n", 1)
    answer, closed = await _exchange(request + _AFTER)
    assert _statuses(answer) == [b"400"] and closed, answer
    error = _error(answer)
    assert error["code"] == "malformed_request", error


async def test_http_1_0_with_a_content_length_alone_is_served() -> None:
    request = b"POST /v1/embed HTTP/1.0\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(_PAGE), _PAGE)
    answer, closed = await _exchange(request)
    assert _statuses(answer) == [b"200"] and answer.endswith(_PAGE) and closed, answer  # (1.0: no keep-alive)

"""The in-flight body budget (`HTMLLM_MAX_INFLIGHT_BYTES`): bodies held at once are bounded, a body past
the bound is a 429 the client can read, and every byte charged is given back. Compressed bodies: where
they are decoded, and how many codings are undone."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.api import limits
from service.api.limits import INLINE_DECODE_BYTES, INLINE_DECODED_BYTES
from service.core.content_coding import MAX_CODINGS, decode_content
from tests.api.conftest import SettingsFactory, app_client, tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page
from tests.api.test_server import metric

MIB = 1024 * 1024
# Larger than the loopback socket buffers take unread, so a 429 sent before the body is read would
# reach a client that is still writing (a reset connection, not a response) unless the server drains.
LARGE = 12 * MIB


@pytest.fixture(scope="module")
def budget_server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    settings = tiny_settings(
        tiny_checkpoint,
        max_body_bytes=LARGE,
        max_inflight_bytes=2 * LARGE,
        retry_after_s=3,
        body_timeout_s=30,
    )
    # The holders stall once they sent their bytes: they hold them for the whole body timeout, not
    # for the stall window (tests/api/test_inflight_budget.py has that).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(limits, "STALL_TIMEOUT_S", settings.body_timeout_s)
        with live_server(settings) as live:
            yield live


def _address(live: LiveServer) -> tuple[str, int]:
    host, port = live.url.removeprefix("http://").split(":")
    return host, int(port)


@contextlib.contextmanager
def holders(live: LiveServer, sizes: list[int]) -> Iterator[list[socket.socket]]:
    """Connections that each declare a body of the given size and send all of it but its last byte:
    the server charges what came (a declared length is never charged) and holds it until the
    connection goes."""
    sockets = []
    try:
        for size in sizes:
            sock = socket.create_connection(_address(live), timeout=30)
            sockets.append(sock)
            sock.sendall(
                b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n"
                b"content-length: %d\r\n\r\n%s" % (size, b"x" * (size - 1))
            )
        _wait_for(live, lambda held: held == sum(sizes) - len(sizes))
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _page_of(size: int, i: int) -> bytes:
    html = page(i).encode()
    return html + b" " * (size - len(html))


def _held(live: LiveServer) -> float:
    return metric(httpx.get(live.url + "/metrics").text, "htmllm_request_body_bytes_in_flight")


def _wait_for(live: LiveServer, condition: object) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        held = _held(live)
        if condition(held):  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"the server holds {_held(live)} bytes")


def _is_overloaded(response: httpx.Response, retry_after: str = "3") -> None:
    assert response.status_code == 429, response.text[:300]
    assert response.headers["retry-after"] == retry_after
    error = response.json()["error"]
    assert error["code"] == "overloaded" and "HTMLLM_MAX_INFLIGHT_BYTES" in error["message"]


def test_a_body_past_the_budget_is_a_429_the_client_reads(budget_server: LiveServer) -> None:
    large = _page_of(LARGE - 1024, 1)
    with holders(budget_server, [LARGE, LARGE // 2]):
        # Declared: refused before any of it is kept, yet read to its end, so httpx (which reads no
        # response before its body is sent) gets the 429 instead of a reset connection.
        _is_overloaded(
            httpx.post(budget_server.url + "/v1/embed", content=large, headers={"content-type": "text/html"})
        )

        # Chunked (no Content-Length): charged as it comes, refused when it passes the budget.
        def chunks() -> Iterator[bytes]:
            for start in range(0, len(large), 256 * 1024):
                yield large[start : start + 256 * 1024]

        _is_overloaded(
            httpx.post(
                budget_server.url + "/v1/embed", content=chunks(), headers={"content-type": "text/html"}
            )
        )
        # What fits is served meanwhile.
        small = httpx.post(budget_server.url + "/v1/embed", json={"documents": [{"html": page(2)}]})
        assert small.status_code == 200, small.text
    _wait_for(budget_server, lambda held: held == 0)  # the holders' charges came back when they left
    served = httpx.post(budget_server.url + "/v1/embed", content=large, headers={"content-type": "text/html"})
    assert served.status_code == 200, served.text[:300]
    assert _held(budget_server) == 0


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one response with a Content-Length, read off a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))[15:]
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def test_a_refused_body_is_read_to_its_end_then_the_connection_is_closed(budget_server: LiveServer) -> None:
    """The 429 comes after the body (dropped as it arrives), so the client, still sending, reads the 429
    instead of a reset. Its connection is then closed (service.api.connections): a retry on a new
    connection may reach a pod with room, where one on this connection would return to this one."""
    large = _page_of(LARGE - 1024, 4)
    sent: list[BaseException | None] = []

    def send_all(sock: socket.socket, data: bytes) -> None:
        try:
            sock.sendall(data)
        except OSError as exc:
            sent.append(exc)
        else:
            sent.append(None)

    with (
        holders(budget_server, [LARGE, LARGE // 2]),
        socket.create_connection(_address(budget_server)) as sock,
    ):
        sock.settimeout(30)
        request = (
            b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n"
        )
        sender = threading.Thread(target=send_all, args=(sock, request % len(large) + large))
        sender.start()
        head, body = _read_response(sock)
        sender.join(timeout=30)
        assert sent == [None]  # the whole body went out: the server read it to its end
        assert head.startswith(b"HTTP/1.1 429 "), head
        assert b"connection: close" in head.lower() and b"retry-after: 3" in head.lower()
        assert json.loads(body)["error"]["code"] == "overloaded"
        assert sock.recv(1) == b""  # closed after the answer
    retried = httpx.post(
        budget_server.url + "/v1/embed", json={"documents": [{"html": "<p>retried on a new connection</p>"}]}
    )
    assert retried.status_code == 200 and len(retried.json()["data"]) == 1


def test_a_compressed_body_is_charged_as_decoded(budget_server: LiveServer) -> None:
    decoded = _page_of(LARGE - 1024, 3)
    compressed = gzip.compress(decoded)
    assert len(compressed) < 64 * 1024
    with holders(budget_server, [LARGE, LARGE // 2]):
        refused = httpx.post(
            budget_server.url + "/v1/embed",
            content=compressed,
            headers={"content-type": "text/html", "content-encoding": "gzip"},
        )
        _is_overloaded(refused)
    _wait_for(budget_server, lambda held: held == 0)
    served = httpx.post(
        budget_server.url + "/v1/embed",
        content=compressed,
        headers={"content-type": "text/html", "content-encoding": "gzip"},
    )
    assert served.status_code == 200, served.text[:300]


def test_expect_100_continue_is_answered_before_the_body(budget_server: LiveServer) -> None:
    with holders(budget_server, [LARGE, LARGE]), socket.create_connection(_address(budget_server)) as sock:
        sock.settimeout(30)
        sock.sendall(
            b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n"
            b"expect: 100-continue\r\ncontent-length: 1000\r\n\r\n"
        )
        answer = b""
        while data := sock.recv(65536):  # nothing of the body was sent: the server answers and closes
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 "), answer[:300]
    assert b"100 continue" not in head.lower() and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "overloaded"
    _wait_for(budget_server, lambda held: held == 0)


def test_every_ending_gives_its_charge_back(budget_server: LiveServer) -> None:
    """413, 422, a client gone mid-body and served requests: the gauge returns to zero."""
    url = budget_server.url + "/v1/embed"
    assert (
        httpx.post(url, content=b"x" * (LARGE + 1), headers={"content-type": "text/html"}).status_code == 413
    )
    assert httpx.post(url, content=b'{"documents": 3}').status_code == 422
    with holders(budget_server, [LARGE]):
        pass  # connected, charged, gone mid-body
    for i in range(3):
        assert httpx.post(url, json={"documents": [{"html": page(i)}]}).status_code == 200
    _wait_for(budget_server, lambda held: held == 0)
    info = httpx.get(budget_server.url + "/info").json()
    assert info["limits"]["max_inflight_bytes"] == 2 * LARGE


def test_a_json_body_is_charged_for_its_strings_too(tiny_checkpoint: Path) -> None:
    """One emoji makes Python hold a page's text in 4 bytes a character: the JSON's strings are charged
    as they are held, beside the body. A request that alone needs more than the budget is a 413 (a 429
    would be retried forever); one that needs more than is free now is a 429."""
    body_cap = 1 * MIB
    settings = tiny_settings(tiny_checkpoint, max_body_bytes=body_cap, max_inflight_bytes=4 * body_cap)
    plain = "<p>" + "word " * 180_000 + "</p>"
    emoji = plain.replace("word ", "\N{GRINNING FACE} ", 1)

    def post(live: LiveServer, html: str) -> httpx.Response:
        content = json.dumps({"documents": [{"html": html}]}, ensure_ascii=False).encode()
        assert 0.8 * body_cap < len(content) < body_cap
        return httpx.post(live.url + "/v1/embed", content=content, timeout=60)

    with live_server(settings) as live:
        assert post(live, plain).status_code == 200  # about 1.8 MiB: body and string
        too_large = post(live, emoji)  # about 4.5 MiB: body and a string of 4 bytes a character
        assert too_large.status_code == 413, too_large.text[:300]
        error = too_large.json()["error"]
        assert error["code"] == "payload_too_large" and "HTMLLM_MAX_INFLIGHT_BYTES" in error["message"]
        with holders(live, [body_cap, body_cap, body_cap]):
            _is_overloaded(post(live, plain), retry_after="1")
        assert post(live, plain).status_code == 200
        _wait_for(live, lambda held: held == 0)


def test_a_client_that_stalls_while_its_refused_body_drains_is_answered(tiny_checkpoint: Path) -> None:
    """The drain has the body timeout: past it the client gets its 429 and the connection is closed
    (returning without an answer made uvicorn send a 500). 2 s: the holder, which stalls too, must
    still hold its bytes when the request comes."""
    settings = tiny_settings(
        tiny_checkpoint, max_body_bytes=LARGE, max_inflight_bytes=LARGE, body_timeout_s=2
    )
    with live_server(settings) as live, holders(live, [LARGE // 2]):
        with socket.create_connection(_address(live), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n"
                b"content-length: %d\r\n\r\n<p>stalls" % LARGE
            )
            answer = b""
            while data := sock.recv(65536):  # until the server closes the connection
                answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429 "), answer[:300]
        assert b"connection: close" in head.lower()
        assert json.loads(body)["error"]["code"] == "overloaded"


def test_expect_100_continue_refused_mid_body_is_drained(budget_server: LiveServer) -> None:
    """Once the server read from the body it has sent `100 Continue` and the client is uploading: a
    refusal then drains the body like any other, so the client sends all of it and reads the 429 (then
    the connection is closed, as after any 429: service.api.connections)."""
    with (
        holders(budget_server, [LARGE, LARGE // 2]),
        socket.create_connection(_address(budget_server)) as sock,
    ):
        sock.settimeout(30)
        sock.sendall(
            b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n"
            b"expect: 100-continue\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        interim = b""
        while b"\r\n\r\n" not in interim:
            interim += sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 "), interim
        chunk = b"x" * (256 * 1024)
        for _ in range(LARGE // len(chunk)):  # past what is free (within the cap), then the end of the body
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        sock.sendall(b"0\r\n\r\n")
        head, body = _read_response(sock)
        assert head.startswith(b"HTTP/1.1 429 ") and b"connection: close" in head.lower(), head
        assert json.loads(body)["error"]["code"] == "overloaded"
        assert sock.recv(1) == b""  # closed after the answer


async def test_a_small_body_that_decodes_large_is_decoded_off_the_event_loop(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body's compressed size says nothing of the work of decoding it: 49,770 bytes of stacked gzip
    held the event loop 8.6 s. A small body is decoded on the loop only up to INLINE_DECODED_BYTES of
    output; past that, again on a worker thread, up to the body cap."""
    loop_thread = threading.get_ident()  # the app runs on the test's loop
    calls: list[tuple[bool, int]] = []  # (on the loop's thread, the limit decoded to)

    def recorded(body: bytes, coding: str, *, limit: int, limit_name: str = "") -> bytes:
        calls.append((threading.get_ident() == loop_thread, limit))
        return decode_content(body, coding, limit=limit, limit_name=limit_name)

    monkeypatch.setattr(limits, "decode_content", recorded)
    small, large = page(1).encode(), _page_of(2 * INLINE_DECODED_BYTES, 2)
    headers = {"content-type": "text/html", "content-encoding": "gzip"}
    async with app_client(settings_for(max_body_bytes=4 * MIB)) as client:
        for html in (small, large):
            body = gzip.compress(html)
            assert len(body) <= INLINE_DECODE_BYTES
            response = await client.post("/v1/preprocess", content=body, headers=headers)
            assert response.status_code == 200, response.text[:300]
    assert calls == [(True, INLINE_DECODED_BYTES), (True, INLINE_DECODED_BYTES), (False, 4 * MIB)]


async def test_more_codings_than_the_cap_are_415(settings_for: SettingsFactory) -> None:
    """As an unknown coding is: a client that lists 2,002 gets a clear answer, not 8.6 s of decoding."""
    html = page(3).encode()
    stacked = html
    for _ in range(MAX_CODINGS):
        stacked = gzip.compress(stacked)
    async with app_client(settings_for()) as client:
        for count, status in ((MAX_CODINGS, 200), (MAX_CODINGS + 1, 415), (2002, 415)):
            body = gzip.compress(stacked) if count > MAX_CODINGS else stacked
            response = await client.post(
                "/v1/preprocess",
                content=body,
                headers={"content-type": "text/html", "content-encoding": ", ".join(["gzip"] * count)},
            )
            assert response.status_code == status, (count, response.text[:300])
            if status == 415:
                error = response.json()["error"]
                assert error["code"] == "unsupported_media_type"
                assert f"more than {MAX_CODINGS} codings" in error["message"]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_413_whose_body_is_left_unread_says_it_closes_and_is_read_whole(
    budget_server: LiveServer, framing: str
) -> None:
    """A body over the cap is answered without its rest being read, and the connection then ends (the
    HTTP protocol closes rather than read it): the answer says `Connection: close` (RFC 9112 §9.6), which
    it had not, so a pooling client reused the connection and lost its next request; and the close
    lingers, so the client still sending reads the 413, not a reset."""
    chunk = b"x" * (256 * 1024)
    # A MiB past the cap: less than the lingering close drops before it closes (4 MiB), so no reset
    # can overtake the answer however slowly this client reads it.
    count = (LARGE + MIB) // len(chunk)
    if framing == "chunked":
        head = b"transfer-encoding: chunked\r\n\r\n"
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(count)) + b"0\r\n\r\n"
    else:
        head = b"content-length: %d\r\n\r\n" % (count * len(chunk))
        body = chunk * count

    def send_all(sock: socket.socket, data: bytes) -> None:
        with contextlib.suppress(OSError):  # the server closes before the end: a reset, a broken pipe
            sock.sendall(data)

    with socket.create_connection(_address(budget_server)) as sock:
        sock.settimeout(30)
        request = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n" + head
        sender = threading.Thread(target=send_all, args=(sock, request + body), daemon=True)
        sender.start()
        answer, error = _read_response(sock)
        assert answer.startswith(b"HTTP/1.1 413 "), answer
        assert b"connection: close" in answer.lower(), answer
        assert json.loads(error)["error"]["code"] == "payload_too_large"
        with contextlib.suppress(OSError):  # closed already: the lingering close ends after 2 s
            sock.shutdown(socket.SHUT_RDWR)
        sender.join(timeout=30)

"""The HTTP/1.1 parser uvicorn runs for the service: httptools, with a cap on each request's head.

Why httptools: uvicorn's pure-Python h11 parser was about 15% of the event loop's time under load, and
httptools with uvloop cut the loop's CPU per request by 13-20% (docs/benchmarks.md, "The front end's
CPU per request"). Why a subclass: uvicorn bounds a request's head (request line and headers) only on
its h11 path (`h11_max_incomplete_event_size`, 16 KiB); with httptools a client can stream one endless
header and the server buffers all of it (200 MB sent, 312 MB resident, measured). Here a head of more
than `MAX_HEAD_BYTES` is answered 431 with the service's error body, and its connection is closed: it
is counted as sent, the whitespace before each header's value too, from its first byte, and refused
once that many bytes of it are parsed with it still open, however the socket's reads split it and
whatever came before it in a read (`Framing`). A head that completed had been measured from what llhttp
gave, which leaves that whitespace out (a 100 KB head, most of it spaces after a colon, was served), and
one still open counted in whole reads after the one it began in (100 KB of a head in one read were held
until the head timeout's 408). Such an answer comes from below the app, so it is not counted in
`htmllm_request_failures_total`. And
a client that pipelines requests and leaves is noticed by the request that is running, not only by the
last one queued (`connection_lost`). Each request's scope carries its connection's age and request
number (`service.api.connections`), which ASGI gives the app no other way to know, so that a
connection's life can be bounded. A client's half-close (its FIN after a request) is its leaving, as
uvicorn has it (and nginx in front of an app): a FIN is the same whether the client closed or only
half-closed, and kept open to answer, every abandoned request's work would run to its end rather than
be cancelled (tests/api/test_http_protocol_half_close.py).

Every answer from below the app (431, 408, 400, 501) waits for the requests before it on the
connection (pipelined) to be answered, and ends in a lingering close: the answer, a half-close, then
what the client still sends is read and dropped, for at most `_LINGER_S` and `_LINGER_BYTES`, before the
close. A close with input still unread makes the kernel send a reset, and a client that was still
sending (a 200 KB head, a large body behind a bad head) got ConnectionResetError in place of the answer.
While the answer waits, reading stays paused, and what is read anyway counts against `_LINGER_BYTES`. A
400 for a malformed body (a bad chunk size) refuses the request that body belongs to, its app told that
the client left, and goes out as soon as the requests before it are answered (at once, as uvicorn's did,
where there are none): waiting for that request's own answer waited for a body that can never complete
(the 10 s stall's 408 came in place of the 400).

Two more gaps of uvicorn's httptools path are closed here. A request that offers to switch protocols
(`Connection: upgrade` with `Upgrade: h2c`, which Java's HttpClient and Spring's RestClient send by
default and `curl --http2` sends on a plain URL) makes llhttp stop at the end of the head: uvicorn
ignored the upgrade but had already started the request with an empty, complete body (400
`empty_input`, or 422 for JSON), the page lost (uvicorn issue 2722). The service switches to nothing
(it has no WebSocket route), so it answers such a request as if the offer had not been made, as RFC 9110
section 7.8 allows: the head is given again, without the offer, to a fresh parser, and the body after
it follows. And uvicorn times a connection out only between requests: one that sends nothing, or half
a head, was held without end (slowloris); a head must now arrive within `head_timeout_s` of the
connection opening or of its first byte (408 `head_timeout` where part of one came; the connection is
closed either way). Bytes that start no request (a bare CRLF, the body of a request already answered)
are bounded by the same timer: uvicorn cancels its keep-alive timer on every read and re-arms it only
after an answer, so such a connection was held without end. And a request answered without its body (a
401, a 413, a GET's) whose body still has more than `UNREAD_BODY_KEPT` to come, or is chunked, ends its
connection in a lingering close after the answer: the parser had read and dropped the rest, any size.

A CONNECT makes llhttp stop at the end of its head too, and stay switched: what follows is the tunnel's.
The service is no proxy, but the request is answered by the app, as a method no route takes is, so that
its 405 carries the `Allow` of its target (RFC 9110 section 15.5.6), computed where every other 405's is
(`service.api.errors`): answered from down here, it had none. Its target, in the authority form CONNECT
is for (`example.com:443`), is no path: the target URI it stands for has an empty path (RFC 9112 section
3.3), the server's root, `/`, whose methods the 405 names (a server that answers every Host as its own
answers every authority so too). The answer closes the connection (`Connection: close`), lingering as
the refusals above do: nothing after the head can be read as HTTP, and a client may have sent its
tunnel's first bytes already.

Three more bounds. A connection may queue at most `MAX_PIPELINED` requests behind the one being answered:
uvicorn queued every pipelined request a read held, and resumed reading after each answer and on each
receive(), so one connection sending `GET /health` without pause queued 330,000 of them (300 MB, kept).
The next one is refused, 429 `overloaded`, as the other refusals are (after the answers before it, a
lingering close): pausing reading instead cannot bound the queue, since a single read (256 KiB, some
10,000 such requests) is parsed whole before any pause takes effect, and httptools says nowhere where
it stopped, so the rest could not be kept to be parsed later. A connection whose answers the client
leaves unread, its writing paused (the transport's buffer over its high-water mark) for longer than
`head_timeout_s`, is aborted: uvicorn's send() waited for the buffer to drain without end, so a request
whose answer could not be written held its task, its memory and its share of the in-flight body budget
for as long as the client liked; aborted, its send() returns, as for any client that left. And a
chunked body's trailer fields are never request headers (RFC 9110 section 6.5.2): uvicorn appended them
to the request's headers, where an `Authorization` trailer passed the key check and a `Content-Encoding`
one decided the body's decoding. They are dropped, the trailer section held to `MAX_HEAD_BYTES` as a
head is (431 past it, the request refused as for a malformed body): httptools buffered an endless
trailer value without bound, copying it whole at each read. A trailer `Connection` changes nothing
either: llhttp acted on a `close` there and dropped, silently, every byte the connection brought after
the request. A trailer `Content-Length` or `Transfer-Encoding` stays llhttp's 400: taken as any trailer
field, one beside a trailer `Connection` had carried into the next request's head (request smuggling).
A chunk's size line (its chunk extensions, which llhttp reads
without a callback) is bounded by the same cap, exactly, however the reads split it: an endless one had
been read at the client's pace until the body stalled, and one that began or ended within a read had
passed up to a read (256 KiB) over the cap.

A close that waits for answers the client has not read (a refusal's lingering close, the keep-alive
timeout, the client's half-close) is bounded too: a transport closes only once its buffer drains, and
below its high-water mark no write timer ran, so a client that read nothing held its socket for as long
as it stayed; it is aborted after `head_timeout_s` in which it read none of them. The pipeline cap's 429
carries `Retry-After` (`retry_after_s`), as every other 429 does, and every JSON answer from down here
(400, 408, 429, 431, 501) carries uvicorn's `Date` as the app's answers do (RFC 9110 section 6.6.1).
Bytes llhttp refuses as no HTTP/1.1 request (a malformed request line, header or chunk) are the 400
`malformed_request`, with llhttp's reason: uvicorn's was plain text, the one error of the service
without a code. A request of an HTTP version other than 1.x (llhttp takes 0.9, a request line without a
version among them, and 2.0; uvicorn answered them as 1.1), or HTTP/2's preface, is answered 505 in
plain text (its client reads no HTTP/1.1 answer); a request line without a version as soon as it ends,
or as soon as anything follows it (llhttp waits for a blank line after one, and an HTTP/0.9 client sends
none: it had the 408, as had one that sent header lines and no blank line). 505 rather than 400,
whatever follows the line: llhttp reads it as HTTP/0.9's, and the answer does not depend on how the
client's bytes were split into reads. A higher minor version of HTTP/1 (`HTTP/1.2`, which llhttp
refused: uvicorn's 400) is served as HTTP/1.1, the highest minor version implemented (RFC 9110 section
2.5): its app sees 1.1, and its answer's status line says 1.1 as every answer's does. Any other request
line of the method PRI (`PRI * HTTP/1.1`) is a 400 as soon as it ends: llhttp waits for the rest of
HTTP/2's preface after each, and the client had the 408; PRI is no method of HTTP/1.x (RFC 9113 section
3.4). And a transfer coding other than chunked is a 501 `unsupported_transfer_coding` (RFC 9112 section
6.1): llhttp decodes chunked alone, so `Transfer-Encoding: gzip, chunked` had passed the body on still
gzipped; an HTTP/1.0 request with any `Transfer-Encoding` is a 400 `malformed_request`: section 6.1 has
a server treat its framing as faulty, even beside a Content-Length (llhttp framed it by its chunks, and
served it). Progress against the write timer counts the bytes the kernel sent too (its send queue, where
the system says), not the transport's buffer alone, which a steady slow reader of pipelined answers
could leave no smaller for a whole period.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

from service.api.connections import CONNECTION_KEY, PROTOCOL_STATUS_KEY, ConnectionAge
from service.api.errors import RETRYABLE, STATUS
from service.api.http_framing import (
    HEAD,
    LOST,
    MAX_HEAD_BYTES,
    TRAILER,
    Framing,
    Parsed,
    declared_body,
    long_lines,
    transfer_coding_refusal,
    transfer_codings,
)
from service.core.errors import ErrorCode
from service.core.worker_health import RecurringWarning

# What a protocol switch offer adds to a head, left out where it is given again (`Connection`'s tokens
# for them too).
_OFFER_HEADERS = frozenset((b"upgrade", b"http2-settings"))
# uvicorn's log line for bytes that are no HTTP/1.1 request (their answer: `malformed_request`).
_INVALID_REQUEST = "Invalid HTTP request received."
# The longest URL httptools parses (its URL parser's offsets are 16-bit): uvicorn parses each request's
# URL once its head is complete, and a longer one failed as an invalid request, a plain-text 400. Such a
# request line alone is over `MAX_HEAD_BYTES` (refused before uvicorn parses the URL); should the cap be
# raised past it, such a URL is still a 431 rather than uvicorn's 400.
_MAX_URL_BYTES = 65535
# How long, and how much, a connection refused from below the app is read (and dropped) after its answer
# before it is closed: time for the client to read the answer, and a bound on what a client can make the
# server read or how long it can hold the connection (Apache's lingering close waits up to 2 s too).
_LINGER_S = 2.0
_LINGER_BYTES = 4 * 1024 * 1024
# The most of a request's body left unread when its answer is complete for the connection to be kept:
# past it (or for a chunked body, whose size is unknown), the connection ends in a lingering close rather
# than the parser reading and dropping the rest (a 401 for a 1 TB `Content-Length` read 9.8 GB in 5 s).
UNREAD_BODY_KEPT = 64 * 1024
# A request scope's extension key: a callable saying, when the request is answered, whether the answer
# leaves so much of its body unread (`UNREAD_BODY_KEPT`) that the connection closes after it, so that
# the answer says `Connection: close` exactly when it does (`service.api.limits`).
UNREAD_BODY_CLOSES_KEY = "htmllm.unread_body_closes"
# The most requests queued on a connection behind the one being answered (pipelined), past which the next
# is refused (429): a client that pipelines waits for its answers in order anyway, and one that sends
# more than this many at once gains nothing from the server holding them (browsers pipeline none).
MAX_PIPELINED = 64
# The head timeout of a protocol made without one: `Settings.head_timeout_s`'s default (the service's
# HTMLLM_HEAD_TIMEOUT_S), so that no protocol is unbounded by omission: uvicorn's keep-alive timer does not
# bound a connection that trickles bytes (it is cancelled on every read, armed again only after an answer).
DEFAULT_HEAD_TIMEOUT_S = 30.0
# `Retry-After` on the pipeline cap's 429 for a protocol made without one: `Settings.retry_after_s`'s
# default (HTMLLM_RETRY_AFTER_S), as every other 429 of the service carries.
DEFAULT_RETRY_AFTER_S = 1
# The HTTP versions served as they are; any other 1.x is served as 1.1 (`_served_version`). llhttp also
# takes 0.9 (a request line without a version reads as one) and 2.0 (`PRI * HTTP/2.0`, HTTP/2's preface,
# among them), and uvicorn answered both as HTTP/1.1.
_VERSIONS = frozenset(("1.0", "1.1"))
_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    505: "HTTP Version Not Supported",
}


def _kernel_unsent(transport: asyncio.BaseTransport) -> int | None:
    """The bytes of `transport`'s socket still in the kernel's send queue (Linux: SIOCOUTQ, which is
    termios.TIOCOUTQ on a socket), not yet sent to (and acknowledged by) the client; None where that
    cannot be asked (another system, a transport without a socket)."""
    try:
        import fcntl
        import termios

        fileno = transport.get_extra_info("socket").fileno()
        queued = fcntl.ioctl(fileno, termios.TIOCOUTQ, struct.pack("i", 0))
    except (ImportError, AttributeError, OSError, ValueError):
        return None
    return int(struct.unpack("i", queued)[0])


def _served_version(version: str) -> str | None:
    """The HTTP version a request of `version` (httptools' "major.minor") is served as: 1.0 and 1.1 as
    they are, a higher 1.x as 1.1, the highest minor version of the major version implemented (RFC 9110
    section 2.5: llhttp refused one, uvicorn's plain 400); None for another major version (505)."""
    if version in _VERSIONS:
        return version
    return "1.1" if version.startswith("1.") else None


def _error_answer(
    code: ErrorCode,
    message: str,
    default_headers: Iterable[tuple[bytes, bytes]],
    retry_after_s: int | None = None,
) -> bytes:
    """A whole HTTP/1.1 answer with the service's error body, closing the connection: for what the
    parser refuses before any request exists. `default_headers`: uvicorn's for every answer (its `date`,
    which RFC 9110 section 6.6.1 has an origin server with a clock send, and `server` where configured),
    as the app's answers carry them. `Retry-After` for a code a client may retry after waiting, as
    `service.api.errors.error_response` gives one."""
    body = json.dumps({"error": {"code": code.value, "message": message}}).encode()
    status = STATUS[code]
    head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status].encode("ascii"))]
    head.extend(name + b": " + value + b"\r\n" for name, value in default_headers)
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
    if code in RETRYABLE and retry_after_s is not None:
        head.append(b"retry-after: %d\r\n" % retry_after_s)
    head.append(b"connection: close\r\n\r\n")
    return b"".join(head) + body


class _StopParse(Exception):
    """Raised from a parser callback to stop the parse where the request is refused (a head or a trailer
    section over the cap, one request too many queued): httptools turns it into an
    `HttpParserCallbackError` out of `feed_data`, the rest of the read left unparsed."""


_HEAD_TOO_LARGE = f"the request line and headers exceed {MAX_HEAD_BYTES} bytes"
_TRAILER_TOO_LARGE = f"the chunked body's trailer fields exceed {MAX_HEAD_BYTES} bytes"
_SIZE_LINE_TOO_LARGE = (
    f"a chunk's size line (its chunk extensions) in the chunked body exceeds {MAX_HEAD_BYTES} bytes"
)
_PRI_METHOD = (
    "PRI is no HTTP/1.1 method: it begins HTTP/2's connection preface (RFC 9113 section 3.4), and this "
    "server speaks HTTP/1.1 only"
)
# What may follow the LF of a PRI request line that llhttp has not refused yet: the rest of HTTP/2's
# preface (`\r\nSM\r\n\r\n`) after each LF in it, cut anywhere (`_pri_line_ended`).
_PREFACE_RESTS = frozenset((b"", b"\r", b"S", b"SM", b"SM\r"))
_TRANSFER_ENCODING_IN_HTTP_1_0 = (
    "malformed HTTP/1.1 request: an HTTP/1.0 request with a Transfer-Encoding has no framing that can be "
    "trusted (RFC 9112 section 6.1): send it as HTTP/1.1, or with a Content-Length alone"
)
_TOO_MANY_PIPELINED = (
    f"too many pipelined requests: at most {MAX_PIPELINED} may wait behind the one being answered; "
    "send the rest on a new connection"
)


def _head_without_offer(method: bytes, url: bytes, version: str, headers: list[tuple[bytes, bytes]]) -> bytes:
    """A request's head as received (names lowercased), without its offer to switch protocols, and no
    longer than it was sent: no whitespace after a field's colon or a list's comma. The head is parsed
    again, held to `MAX_HEAD_BYTES` again, and the cap is the head's as sent: written `name: value`, a
    head within the cap sent as `name:value` had passed it by a byte a field, and got a 431."""
    lines = [method + b" " + url + b" HTTP/" + version.encode("ascii")]
    for name, value in headers:
        if name in _OFFER_HEADERS:
            continue
        if name == b"connection":
            tokens = [token.strip() for token in value.split(b",")]
            kept = [token for token in tokens if token and token.lower() not in _OFFER_HEADERS]
            if not kept:
                continue
            value = b",".join(kept)
        lines.append(name + b":" + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _malformed_message(error: Exception) -> str:
    """The message of the 400 for bytes llhttp refused (`error`): its reason, one of llhttp's own fixed
    strings (`Invalid header value char`), never the client's bytes."""
    import httptools

    if isinstance(error.__context__, httptools.HttpParserInvalidURLError):  # (uvicorn's, in a callback)
        return "malformed HTTP/1.1 request: the request target is no URL"
    return f"malformed HTTP/1.1 request: {error}" if str(error) else "malformed HTTP/1.1 request"


def _pri_line_ended(data: bytes) -> bool:
    """Whether a PRI request's line has ended in `data`, a read just parsed into that request's head
    (which llhttp has not refused). A PRI request line is followed by nothing but HTTP/2's preface, and
    llhttp refuses any other byte at once, so the line has ended exactly when `data` has an LF after
    which only the rest of the preface came (`_PREFACE_RESTS`); a request line still open holds the
    method's P after the read's last LF, if it has one. An LF of an earlier read ended the line there,
    where it was answered."""
    end = data.rfind(b"\n")
    return end >= 0 and data[end + 1 :] in _PREFACE_RESTS


def _connect_target(url: bytes) -> bytes | None:
    """The target of a CONNECT as the app reads one, in origin form (a path and a query): the server's
    root where it is no path (the authority form CONNECT is for, `*`, an absolute URI without one); None
    where it is a path that is no URL, which any other method's request is refused for (400)."""
    import httptools

    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return None if url.startswith(b"/") else b"/"
    if parsed.path is None or (parsed.schema is None and not url.startswith(b"/")):
        return b"/"
    return parsed.path + (b"?" + parsed.query if parsed.query else b"")


class _LingeringClose:
    """A request cycle's transport: the close uvicorn makes after an answer that says `Connection: close`
    (or after a failed app) is the protocol's (`close`), which lingers where input is left unread (a
    CONNECT's tunnel bytes, the rest of a body answered without being read): an abrupt close would send
    a reset that can take the answer with it."""

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self._transport = transport
        self._close = close

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._close()


def protocol_class(
    head_timeout_s: float | None = DEFAULT_HEAD_TIMEOUT_S, retry_after_s: int | None = DEFAULT_RETRY_AFTER_S
) -> type[asyncio.Protocol] | str:
    """uvicorn's `http` setting: the bounded httptools protocol, or "h11" where httptools is missing.
    `head_timeout_s`: how long a connection may take to send a request's head, how long bytes that
    start no request may hold it, and how long a closing connection may wait for its client to read
    what is still unsent (None: no limit, for tests; a client that never completes a head, or trickles
    such bytes, then holds its connection without end). `retry_after_s`: the pipeline cap's 429's
    `Retry-After` (HTMLLM_RETRY_AFTER_S; None: none)."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is in the serve extra; a bare uvicorn falls back to h11
        logging.getLogger(__name__).warning(
            "httptools is not installed: uvicorn's h11 parser serves, without the bounds of "
            "service.api.http_protocol (head size and time, pipelined requests, unread answers, trailers); "
            "install the serve extra"
        )
        return "h11"

    # Bytes that are no HTTP/1.1 request come in floods (scanners, TLS on the plain port): one warning a
    # minute for all the connections of this server, the others at debug level (each one had been a line).
    malformed = RecurringWarning(logging.getLogger("uvicorn.error"))

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """httptools' protocol that refuses a head longer than `MAX_HEAD_BYTES` (431, then closes), or
        slower than `head_timeout_s` (408, then closes), or queued behind `MAX_PIPELINED` others (429),
        drops a chunked body's trailer fields (431 past `MAX_HEAD_BYTES`), aborts a connection whose
        answers stay unread for `head_timeout_s`, and answers a request that offers to switch protocols
        as if it had not (the module's docstring).

        A head and a trailer section are held to the cap as sent, exactly: httptools reports no offsets,
        so where each lies in a read is followed alongside it (`Framing`, the heads' ends, the bodies'
        lengths that llhttp read from them), and the read is parsed up to where one would have
        `MAX_HEAD_BYTES` still open, then refused (`_section_points`). What the callbacks give is
        measured too, once a head completes (`on_headers_complete`) and as trailer fields do
        (`_on_trailer_field`): the request line, each field (name, ":", value with its trailing
        whitespace, CRLF) and the blank line, never more than was sent (llhttp drops the whitespace
        before a value), so never a refusal the framing would not make; it stands where the framing is
        not followed (`LOST`).

        A chunk's size line is measured exactly: it has no LF, so one still open at the end of a read is
        what follows the read's last LF (or the whole read, where it began earlier), and one that ends
        within a read and passes the cap is one of its long lines (`long_lines`), up to which the read is
        parsed before the rest, so that the parser says whether it is in a size line there.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = False
            self._messages = 0  # the requests begun, for telling one open head from the next
            self._head_size = 0  # the headers parsed so far of the current head, as sent
            self._line_open = False  # the current head's request line may not have ended yet
            self._line = bytearray()  # ... its bytes in the reads before, while it is (`_versionless_line`)
            self._stopped: tuple[bytes, int] | None = None  # the refusal `_StopParse` was raised for
            self._refusal: bytes | None = None  # an answer from below the app, written once it is our turn
            self._lingering = False  # the refusal is written and the connection half-closed
            self._linger_left = 0  # bytes still read (and dropped) before the close, from the refusal on
            self._linger_timer: asyncio.TimerHandle | None = None
            self._running: Any = None  # the request cycle whose app runs (not always `self.cycle`)
            # uvicorn makes one protocol per connection, just before the connection is made.
            self._opened = time.monotonic()
            self._requests = 0
            self._offered_upgrade = False  # the head just parsed offered a protocol switch
            self._head_timer: asyncio.TimerHandle | None = None
            self._body_left: int | None = 0  # the parser's request's body to come (None: chunked)
            self._keeps_alive = True  # whether llhttp keeps the connection, by its request's head
            self._lenient_keep_alive = False  # llhttp told to, whatever a trailer `Connection` says
            self._trailer_open = False  # past a chunk's size line with no body byte since: maybe a trailer
            self._trailer_size = 0  # its fields parsed so far, as sent
            self._framing = Framing()  # where heads and trailer sections lie in what is read
            # What llhttp said while parsing the bytes fed since the framing last walked, from
            # `_fed_from` in the read on (`Parsed`): its chunk events, its other events, and the bytes
            # of the current chunk's data given since its header.
            self._fed_from = 0
            self._chunk_events = 0
            self._other_events = 0
            self._chunk_data = 0
            self._size_line_open = False  # in a chunked body, before a chunk's size line is complete
            self._size_line_new = False  # ... entered in the current read
            self._size_line_bytes = 0  # the reads counted against a size line still incomplete
            self._write_timer: asyncio.TimerHandle | None = None  # armed while writing is paused
            self._write_left = 0  # the transport's buffer when the write timer was armed
            self._kernel_left: int | None = None  # ... and its socket's kernel send queue (`_kernel_unsent`)
            self._set_lenient_version()

        def _set_lenient_version(self) -> None:
            """Have llhttp take any HTTP/d.d version (it refused 1.2 and 3.0, uvicorn's plain 400), so that
            the head's version decides (`_served_version`: 1.x served, 505 for the rest)."""
            with contextlib.suppress(AttributeError):  # (httptools before 0.6.3 has no leniencies)
                self.parser.set_dangerous_leniencies(lenient_version=True)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def connection_lost(self, exc: Exception | None) -> None:
            """uvicorn tells only the newest request cycle that the client left; with requests
            pipelined behind a running one, that is a queued one, and the running request then wrote
            its response into the closed transport (a RuntimeError under uvloop: a 500 and a traceback
            for a client that left, its page still embedded). Tell the running one too: it stops like
            any request whose client left (499).

            And the keep-alive timer goes with the connection however it ended: uvicorn cancels it only
            for a close without error, so a connection the client reset (RST after its answer) kept its
            protocol, request cycle and body-budget charge until the timer fired
            (HTMLLM_KEEP_ALIVE_TIMEOUT_S, 75 s)."""
            running = self._running
            if running is not None and running is not self.cycle and not running.response_complete:
                running.disconnected = True
                running.message_event.set()
            self._cancel_head_timer()
            self._cancel_write_timer()
            if self._linger_timer is not None:
                self._linger_timer.cancel()
                self._linger_timer = None
            super().connection_lost(exc)
            self._unset_keepalive_if_required()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._other_events += 1
            self._in_head = True
            self._messages += 1
            self._head_size = 0
            self._line_open = True
            self._line.clear()
            self._offered_upgrade = False
            self._trailer_open = False
            self._size_line_open = False
            if self._lenient_keep_alive:  # (for the request with the trailer `Connection` only)
                self._set_lenient_keep_alive(False)
            self._arm_head_timer()

        def on_header(self, name: bytes, value: bytes) -> None:
            # name ":" value CRLF; the whitespace before the value is not given (the class's docstring)
            if not self._in_head:  # a trailer field (only a head and a trailer section have fields)
                self._on_trailer_field(name, value)
                return
            self._head_size += len(name) + len(value) + 3  # (before uvicorn strips the value's end)
            super().on_header(name, value)

        def _on_trailer_field(self, name: bytes, value: bytes) -> None:
            """Drop a trailer field, never a request header (RFC 9110 section 6.5.2: an `Authorization`
            there had passed the key check), and count it against the cap (the class's docstring)."""
            self._other_events += 1
            self._trailer_size += len(name) + len(value) + 3
            if self._trailer_size + 2 > MAX_HEAD_BYTES:
                self._stop(*self._error_answer(ErrorCode.HEADERS_TOO_LARGE, _TRAILER_TOO_LARGE))
            if name.lower() == b"connection" and self._keeps_alive and not self._lenient_keep_alive:
                # llhttp reads `Connection` here as in a head: after a `close`, it would drop every byte
                # that follows the request, silently (uvicorn's leniency), its next requests never
                # answered. Lenient, it goes on as the head said.
                self._set_lenient_keep_alive(True)

        def _set_lenient_keep_alive(self, lenient: bool) -> None:
            self._lenient_keep_alive = lenient
            with contextlib.suppress(AttributeError):  # (httptools before 0.6.3 has no leniencies)
                self.parser.set_dangerous_leniencies(lenient_keep_alive=lenient)

        def on_chunk_header(self) -> None:
            self._chunk_events += 1
            self._chunk_data = 0
            self._size_line_open = False
            self._trailer_open = True
            self._trailer_size = 0

        def on_chunk_complete(self) -> None:
            self._chunk_events += 1
            self._trailer_open = False
            # The next chunk's size line opens (after the last chunk, the message completes):
            # `_open_size_line` written out, as a call per chunk is a share of a small chunk's CPU.
            self._size_line_open = self._size_line_new = True
            self._size_line_bytes = 0

        def _open_size_line(self) -> None:
            """A chunk's size line begins: llhttp reads its chunk extensions (`5;name=value`) and gives
            no callback until the line ends, so an endless one was read, at the client's pace, until
            the body stalled (no byte of it for 10 s); it is counted against `MAX_HEAD_BYTES`, exactly
            (the class's docstring, `data_received`)."""
            self._size_line_open = True
            self._size_line_new = True
            self._size_line_bytes = 0

        def _stop(self, answer: bytes, status: int) -> NoReturn:
            """Stop the parse from a callback: `data_received` refuses with `answer` (of `status`)."""
            self._stopped = (answer, status)
            raise _StopParse

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._cancel_head_timer()
            method, version = self.parser.get_method(), self.parser.get_http_version()
            request_line = len(method) + len(self.url) + len("HTTP/") + len(version) + 4
            if request_line + self._head_size + 2 > MAX_HEAD_BYTES:  # (no request yet)
                self._stop(*self._error_answer(ErrorCode.HEADERS_TOO_LARGE, _HEAD_TOO_LARGE))
            if _served_version(version) is None:  # (no request yet)
                self._stop(self._version_refusal(version), 505)
            if version == "1.0" and any(name == b"transfer-encoding" for name, _ in self.headers):
                # HTTP/1.0 has no transfer codings: llhttp framed the body by its chunks, where the
                # sender (or a proxy in front, reading it as 1.0) may frame it otherwise. (No request yet.)
                self._stop(*self._error_answer(ErrorCode.MALFORMED_REQUEST, _TRANSFER_ENCODING_IN_HTTP_1_0))
            refusal = transfer_coding_refusal(transfer_codings(self.headers))
            if refusal is not None:  # (no request yet; before an offer's head is given again)
                self._stop(*self._error_answer(*refusal))
            if self.parser.should_upgrade():  # (set before this callback; llhttp stops after it)
                self._offered_upgrade = True  # no request yet: `data_received` gives the head again
                return
            if len(self.pipeline) >= MAX_PIPELINED:  # (no request yet: it is never queued)
                self._stop(*self._error_answer(ErrorCode.OVERLOADED, _TOO_MANY_PIPELINED))
            self._begin_request(declared_body(self.headers))

        def _begin_request(self, body_left: int | None) -> None:
            """Start (or queue behind the requests before it) the request whose head was just parsed,
            with `body_left` bytes of body to come (None: chunked)."""
            self._body_left = body_left
            self._framing.bodies.append(body_left)
            if body_left is None:  # (chunked: its first chunk's size line comes next)
                self._open_size_line()
            self._keeps_alive = self.parser.should_keep_alive()
            self._requests += 1
            age = ConnectionAge(opened=self._opened, request=self._requests)
            self.scope[CONNECTION_KEY] = age  # type: ignore[literal-required]  # an extension key
            super().on_headers_complete()
            # (a higher 1.x is served as 1.1: its app sees 1.1, as its answer's status line says)
            self.scope["http_version"] = _served_version(self.scope["http_version"]) or "1.1"
            cycle: Any = self.cycle  # (its transport is swapped for one that is no asyncio.Transport)
            cycle.transport = _LingeringClose(self.transport, functools.partial(self._close_after, cycle))
            cycle.scope[UNREAD_BODY_CLOSES_KEY] = functools.partial(self._unread_body_left, cycle)

        def _close_after(self, cycle: Any) -> None:
            """uvicorn's close of the connection after `cycle`'s answer (it said `Connection: close`, or
            the app failed): lingering where input is left unread (`_linger`): any of a body answered
            without being read (a 401 or a 413 whose rest is still coming: closed at once, a client still
            sending got a reset, not the answer), a CONNECT's tunnel. A refusal still waiting to be
            written is not: no answer follows one that closes."""
            if self._lingering or self.transport.is_closing():
                return
            unread = cycle is self.cycle and cycle.more_body and not cycle.disconnected
            if self._refusal is None and unread:
                self._linger_left = _LINGER_BYTES
            elif self._refusal is None:
                self._close()
                return
            self._refusal = b""
            self._linger()

        def on_body(self, body: bytes) -> None:
            self._trailer_open = False  # (a data chunk's)
            if self._body_left is not None:
                self._body_left -= len(body)
            else:
                self._chunk_data += len(body)
            if not self._offered_upgrade:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._other_events += 1
            self._size_line_open = False
            if not self._offered_upgrade:  # (llhttp ends an upgrading request at its head)
                super().on_message_complete()

        def data_received(self, data: bytes) -> None:
            """Parse a read, in parts where the parser's state there decides whether a head, a trailer
            section or a chunk's size line passes the cap (`_parse_points`), so that each is refused
            once its first `MAX_HEAD_BYTES` bytes are parsed with it still open, wherever the read's bounds
            fall."""
            if self._refusal is not None:  # refused: what follows is read only to be dropped
                self._drop(len(data))
                return
            self._fed_from = self._chunk_events = self._other_events = 0
            if len(data) < self._room():  # (nothing can reach the cap in this read: parsed whole)
                if self._feed_data(data, 0, len(data)):
                    self._walk(data, 0, len(data))
                    self._framing.read_done(data)
                    self._bound_request_line(data)
                return
            fed = 0
            for point, over_cap in self._parse_points(data):
                if point > fed and not self._feed_data(data, fed, point):
                    return
                fed = max(fed, point)
                if over_cap is not None and (message := over_cap()) is not None:
                    self._refuse(*self._error_answer(ErrorCode.HEADERS_TOO_LARGE, message))
                    return
            self._bound_request_line(data)

        def _parse_points(self, data: bytes) -> Iterator[tuple[int, Callable[[], str | None] | None]]:
            """Where to stop parsing a read, and what to ask there (the message of a 431, or None): the
            long lines that may be a chunk's size line (`_long_lines_in`), merged in order with the points
            of `_section_points`, which depend on the parser's state where the read is parsed up to."""
            long_lines = iter(self._long_lines_in(data))
            long_line = next(long_lines, None)
            for point, over_cap in self._section_points(data):
                while long_line is not None and long_line <= point:
                    yield long_line, self._size_line_over_cap
                    long_line = next(long_lines, None)
                yield point, over_cap

        def _room(self) -> int:
            """The bytes a read may hold without a head, a trailer section or a chunk's size line reaching
            `MAX_HEAD_BYTES` in it: less what one open at its start has already."""
            framing = self._framing
            room = MAX_HEAD_BYTES + framing.start if framing.kind in (HEAD, TRAILER) else MAX_HEAD_BYTES
            return min(room, MAX_HEAD_BYTES - self._size_line_bytes) if self._size_line_open else room

        def _size_line_over_cap(self) -> str | None:
            # (parsed up to a long line, the parser is in it: a size line)
            return _SIZE_LINE_TOO_LARGE if self._size_line_open else None

        def _section_points(self, data: bytes) -> Iterator[tuple[int, Callable[[], str | None] | None]]:
            """Where to stop parsing `data` so that a head or a trailer section is refused exactly once
            `MAX_HEAD_BYTES` of it are parsed with it still open, counted as sent (the whitespace before a
            header's value too), wherever the reads split it and whatever came before it in the read: where
            the connection's framing (`Framing`) puts that many bytes of it. The framing learns a request's
            body from llhttp once its head is parsed, so the read is parsed past a head's end before
            it is followed further (up to the cap past it: no head or trailer section beginning after it
            can reach the cap before), and it follows a chunked body only as far as llhttp has parsed it,
            so the read is parsed a cap's worth past where it stands there (likewise) before it is
            followed further (`Framing._after_chunks`). The last point is the read's end."""
            framing = self._framing
            size = len(data)
            parsed = position = 0
            while True:
                position, cut = self._walk(data, position, parsed)
                if cut is not None:
                    at, kind, request = cut
                    over_cap = self._head_over_cap if kind == HEAD else self._trailer_over_cap
                    yield at, functools.partial(over_cap, request)
                    # (not refused: llhttp is not where the framing says, which is then not followed)
                    self.logger.warning("the HTTP framing followed lost llhttp's at %d of a read", at)
                    framing.kind = LOST
                    parsed = at
                    break
                if position >= size:
                    break
                parsed = min(size, position + MAX_HEAD_BYTES)
                yield parsed, None
            if parsed < size:
                yield size, None
            framing.read_done(data)

        def _walk(self, data: bytes, position: int, parsed: int) -> tuple[int, tuple[int, int, int] | None]:
            """`Framing.walk` of `data` from `position`, parsed up to `parsed`, told what llhttp said
            while parsing the bytes fed since the last walk (`Parsed`), which are then none."""
            said = Parsed(
                self._fed_from, self._chunk_events, self._other_events, self._size_line_open, self._chunk_data
            )
            self._fed_from, self._chunk_events, self._other_events = parsed, 0, 0
            return self._framing.walk(data, position, parsed, said)

        def _head_over_cap(self, request: int) -> str | None:
            """The 431's message where the head of request `request` (`_messages`) is still open."""
            return _HEAD_TOO_LARGE if self._in_head and self._messages == request else None

        def _trailer_over_cap(self, request: int) -> str | None:
            """The 431's message where the trailer section of request `request` is still open."""
            return _TRAILER_TOO_LARGE if self._trailer_open and self._messages == request else None

        def _long_lines_in(self, data: bytes) -> Iterator[int]:
            """`_long_lines` of a read where a chunk's size line may be among them: none in one too short to
            hold one, nor in one that is all body of a request with a Content-Length (a large upload's)."""
            carried = self._size_line_bytes if self._size_line_open else 0
            if carried + len(data) <= MAX_HEAD_BYTES:
                return iter(())
            if not self._in_head and self._body_left is not None and self._body_left >= len(data):
                return iter(())
            return long_lines(data, carried)

        def _feed_data(self, read: bytes, start: int, end: int) -> bool:
            """Parse `read[start:end]`, a read or a part of one; whether to go on with the rest of the read
            (not once the connection is refused or closing, nor where the rest went with a head given
            again)."""
            data = read if start == 0 and end == len(read) else read[start:end]
            self._size_line_new = False
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as error:
                if self._stopped is not None:
                    self._refuse(*self._stopped)
                elif self._in_head and self.parser.get_method() == b"PRI":
                    # HTTP/2's connection preface (prior knowledge): llhttp stops at it, before any head;
                    # or a PRI request that is not the preface.
                    self._refuse_pri()
                elif len(self.url) > _MAX_URL_BYTES:  # (a URL uvicorn cannot parse)
                    self._refuse_head_too_large()
                else:
                    malformed.log(
                        time.monotonic(), "%s (%s; at most one such line a minute)", _INVALID_REQUEST, error
                    )
                    self.send_400_response(_malformed_message(error))
                return False
            except httptools.HttpParserUpgrade as upgrade:
                self._give_head_again(read[start + upgrade.args[0] :])
                return False
            if self.transport.is_closing():
                return False
            self._bound_open_parts(data)
            return self._refusal is None and not self.transport.is_closing()

        def _bound_open_parts(self, data: bytes) -> None:
            """Bound what `data`, just parsed, leaves open: bytes that start no request, a chunk's size line,
            a trailer section, a request line without a version, a head (the module's docstring)."""
            if self._idle():
                # Nothing to answer, yet bytes came (a bare CRLF, the body of a request already answered):
                # uvicorn cancelled its keep-alive timer on this read and re-arms it only after an answer,
                # so such a connection was held without end. The head timer bounds it (not moved by later
                # reads); a head that follows completes in time or is refused as any other.
                self._arm_head_timer()
            if self._size_line_open:  # (a size line has no LF: it began after the last one, if in `data`)
                if self._size_line_new:
                    self._size_line_bytes = len(data) - data.rfind(b"\n") - 1
                else:
                    self._size_line_bytes += len(data)
                if self._size_line_bytes >= MAX_HEAD_BYTES:  # (over the cap with the LF still to come)
                    self._refuse(*self._error_answer(ErrorCode.HEADERS_TOO_LARGE, _SIZE_LINE_TOO_LARGE))
                return
            if self._in_head and self.parser.get_http_version() == "0.9":
                # (llhttp reads a request line without a version as 0.9's once a byte follows its end; one
                # that ends a read is `_bound_request_line`'s)
                self._refuse(self._version_refusal("0.9"), 505)
                return
            if self._in_head and self.parser.get_method() == b"PRI" and _pri_line_ended(data):
                # llhttp waits for the rest of HTTP/2's preface after any PRI request line, so a client
                # sending `PRI * HTTP/1.1` and a blank line waited for the head timeout's 408.
                self._refuse_pri()

        def _bound_request_line(self, data: bytes) -> None:
            """A read parsed whole and followed (`Framing`) that ended a head's request line without a
            version is refused, 505 (`_versionless_line`)."""
            if (
                self._line_open
                and self._in_head
                and self._refusal is None
                and not self.transport.is_closing()
                and self._versionless_line(data)
            ):
                self._refuse(self._version_refusal("0.9"), 505)

        def _versionless_line(self, data: bytes) -> bool:
            """Whether `data`, a read parsed whole into a head still open and followed by the framing,
            ended its request line without a version (HTTP/0.9's `GET /`, CRLF or a bare LF): llhttp
            waits for headers after one, so the 505 of `on_headers_complete` came only once a blank line
            did, and a client sending just the line (as an HTTP/0.9 one does, then waits) got the head
            timeout's 408 instead.

            httptools says nowhere where a head begins in a read; the framing does (`Framing.start`). The
            request line is what follows it up to the first LF, with its bytes from earlier reads, kept
            (`_line`) while it is open; it is one without a version exactly when it is the method, spaces
            and the URL the parser gave. Only a line that ends the read is looked at: once a byte follows
            it, llhttp reports the version 0.9 (`_bound_open_parts`). The line had been taken from the LF
            before it, which, behind a body that did not end with one (pipelined after a Content-Length
            body in the same read), lay in an earlier request's head: the body glued to it, the line was
            not recognised and the client got the 408 30 s later."""
            framing = self._framing
            if framing.kind != HEAD:  # (the framing lost, `_section_points`: no line is known)
                return False
            began = framing.start + len(data)  # (where the head began in `data`, after `read_done`)
            if began >= 0:
                end = data.find(b"\n", began)
                if end < 0:
                    self._line[:] = data[began:]
                    return False
                line = data[began:end]
            else:
                end = data.find(b"\n")
                if end < 0:
                    self._line += data
                    return False
                line = bytes(self._line) + data[:end]
            self._line_open = False
            self._line.clear()
            if end != len(data) - 1:  # (bytes follow the line's end: llhttp's version says)
                return False
            before, space, url = line.removesuffix(b"\r").rpartition(b" ")
            return bool(space) and url == self.url and before.rstrip(b" ") == self.parser.get_method()

        def _refuse_head_too_large(self) -> None:
            self._refuse(*self._error_answer(ErrorCode.HEADERS_TOO_LARGE, _HEAD_TOO_LARGE))

        def send_400_response(self, msg: str) -> None:
            """uvicorn's 400 for bytes that are no HTTP/1.1 request, as the service's JSON error
            (`malformed_request`, `msg` its message) rather than uvicorn's plain text, and through
            `_refuse`: after the answers before it, and with a lingering close (a bad head with a large
            body behind it lost its 400 to a reset)."""
            self._refuse(*self._error_answer(ErrorCode.MALFORMED_REQUEST, msg))

        def _refuse_pri(self) -> None:
            """Refuse a request of the method PRI, whose line has ended: HTTP/2's preface (`PRI *
            HTTP/2.0`) is a 505, as any request of HTTP/2.0; for any other version, PRI is a method no
            HTTP version has but as that preface (RFC 9113 section 3.4), so the request is malformed."""
            if self.parser.get_http_version() == "2.0":
                self._refuse(self._version_refusal("2.0"), 505)
            else:
                self.send_400_response(_PRI_METHOD)

        def _error_answer(self, code: ErrorCode, message: str) -> tuple[bytes, int]:
            """The service's error answer for `code` from below the app (the module's `_error_answer`),
            with uvicorn's default headers (`date`) as the app's answers have them, and its status."""
            default_headers = self.server_state.default_headers
            return _error_answer(code, message, default_headers, retry_after_s), STATUS[code]

        def _version_refusal(self, version: str) -> bytes:
            """505 for a request of an HTTP version other than 1.x (RFC 9110 section 15.6.6)."""
            without = " (or a request line without a version)" if version == "0.9" else ""
            return self._plain_answer(505, f"HTTP/{version}{without} is not supported: send HTTP/1.1")

        def _plain_answer(self, status: int, msg: str) -> bytes:
            """A whole plain-text answer of `status`, closing the connection, as uvicorn writes its 400:
            for a request of another HTTP version than 1.x, whose client reads no HTTP/1.1 answer, let
            alone a JSON error body of ours."""
            content = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status].encode("ascii"))]
            for name, value in self.server_state.default_headers:  # (server, date)
                content.append(name + b": " + value + b"\r\n")
            content.append(b"content-type: text/plain; charset=utf-8\r\n")
            content.append(b"content-length: %d\r\nconnection: close\r\n\r\n" % len(msg))
            return b"".join(content) + msg.encode("ascii")

        def _refuse(self, answer: bytes, status: int) -> None:
            """Answer `answer` (of `status`) and close, in turn: requests before it on the connection
            (pipelined) are answered first, or the refusal would be read as their answer (reads pause
            meanwhile).

            Where the error lies in a request's body (a malformed chunk), that request is the one refused:
            its body can never complete, so waiting for its answer would wait for the body timeout. It is
            taken out of the queue, or, running, told that its client left (as uvicorn tells a request
            whose connection closed), and the answer goes out once the requests before it are answered."""
            self._in_head = False
            self._cancel_head_timer()
            self._refusal = answer
            self._linger_left = _LINGER_BYTES
            refused = self.cycle
            if refused is not None and refused.more_body and not refused.response_complete:
                self._withdraw(refused, status)
            if self.pipeline or (self._running is not None and not self._running.response_complete):
                self.flow.pause_reading()
                return
            self._linger()

        def _withdraw(self, cycle: Any, status: int) -> None:
            """Take `cycle`, the request whose body the parser refused, out of the queue, or stop its app
            (its receive() gives `http.disconnect`, its answer is not written); it never completes, so it is
            not waited for. A running one's scope records that the client got `status` in its place (the
            access log and the request metrics had recorded a 499, or the app's answer that was never
            written: `PROTOCOL_STATUS_KEY`)."""
            for queued in self.pipeline:
                if queued[0] is cycle:
                    self.pipeline.remove(queued)
                    return
            if not cycle.response_started:
                cycle.scope[PROTOCOL_STATUS_KEY] = status
            cycle.disconnected = True
            cycle.waiting_for_100_continue = False  # (no "100 Continue" into the half-closed connection)
            cycle.message_event.set()
            if cycle.response_started:  # (its answer is cut short: a 400 would be read as part of it)
                self._refusal = b""
            self._running = None

        def _idle(self) -> bool:
            """Whether no request is in progress: no head open, none queued, none being answered."""
            running = self._running
            return (
                not self._in_head
                and not self.pipeline
                and (running is None or running.response_complete)
                and self._refusal is None
            )

        def on_response_complete(self) -> None:
            answered = self._running  # (before the next request queued starts)
            super().on_response_complete()  # (starts the next request queued, and resumes reading)
            if self._refusal is None and not self.transport.is_closing() and self._unread_body_left(answered):
                # Answered without its body (a 401, a 413, a GET's): rather than read and drop the rest
                # (any size, at the loop's pace), end the connection, lingering so the answer is not
                # lost to a reset. A small rest is read and dropped, the connection kept.
                self._refusal = b""
                self._linger_left = _LINGER_BYTES
            if self._refusal is None or self._lingering or self.transport.is_closing():
                return
            if not self.pipeline and (self._running is None or self._running.response_complete):
                self._unset_keepalive_if_required()
                self._linger()
            else:
                self.flow.pause_reading()  # (what follows the refusal is not read while it waits)

        def _unread_body_left(self, cycle: Any) -> bool:
            """Whether `cycle`, just answered, still has more than `UNREAD_BODY_KEPT` of its body to come,
            or a chunked one."""
            # (a request the parser is past has its whole body read)
            if cycle is None or cycle is not self.cycle or not cycle.more_body or cycle.disconnected:
                return False
            return self._body_left is None or self._body_left > UNREAD_BODY_KEPT

        def _linger(self) -> None:
            """Write the refusal, half-close, and close once the client closes too, or after `_LINGER_S`
            or once more than `_LINGER_BYTES` came after the refusal: closing at once with its input unread
            sends a reset, which can take the answer with it. Where the transport cannot half-close (TLS),
            it closes."""
            assert self._refusal is not None
            self._lingering = True
            self.transport.write(self._refusal)
            if not self.transport.can_write_eof():
                self._close()
                return
            self.transport.write_eof()
            self.flow.resume_reading()
            # (the client's own close ends the wait: `eof_received` returns None, and the transport closes)
            self._linger_timer = self.loop.call_later(_LINGER_S, self._end_linger)

        def _drop(self, size: int) -> None:
            """Drop `size` bytes read after the refusal, counted against `_LINGER_BYTES`. Before the
            refusal is written (answers before it still running), reading pauses again: uvicorn resumes it
            as each of those requests calls receive() or is answered, and the client could otherwise send
            without end, all of it read and dropped."""
            self._linger_left -= size
            if not self._lingering:
                self.flow.pause_reading()
                return
            if self._linger_left < 0:
                self._end_linger()

        def _end_linger(self) -> None:
            self._linger_timer = None
            self._close()

        def _close(self) -> None:
            """Close the connection, its unsent answers bounded (`_bound_close`)."""
            if not self.transport.is_closing():
                self.transport.close()
            self._bound_close()

        def _bound_close(self) -> None:
            """A closing transport waits for its write buffer to drain before it lets the socket go, for
            ever where the client reads nothing; below the buffer's high-water mark no write timer runs
            (`pause_writing`), so a client that never read (a refusal after answers that filled the
            kernel's buffers, a keep-alive timeout, its own half-close) held its socket for as long as
            it stayed (tests/api/test_http_protocol_unread_close.py). The write timer bounds it: aborted
            after `head_timeout_s` in which the client read none of it."""
            if head_timeout_s is None or self._write_timer is not None or not self.transport.is_closing():
                return
            try:
                unsent = self.transport.get_write_buffer_size()
            except NotImplementedError:  # (asyncio's base class: a transport that keeps no buffer)
                return
            if unsent:
                self._arm_write_timer(unsent, _kernel_unsent(self.transport))

        def timeout_keep_alive_handler(self) -> None:
            self._close()

        def shutdown(self) -> None:
            super().shutdown()  # (closes an idle connection)
            self._bound_close()

        def eof_received(self) -> None:
            """The client's FIN: its leaving (the module's docstring). The transport closes once this
            returns, bounded here as any other close."""
            self._close()

        def _give_head_again(self, rest: bytes) -> None:
            """Parse the head just read again without its offer to switch protocols, then `rest` (the
            body, and whatever follows it), with a fresh parser: llhttp's stays switched."""
            method = self.parser.get_method()
            if method == b"CONNECT":  # (llhttp switches at every CONNECT: there is no body to read)
                self._answer_connect(rest)
                return
            if not self._offered_upgrade:  # (never: llhttp switches only where the head offered it)
                self.send_400_response("malformed HTTP/1.1 request: a protocol switch nothing offered")
                return
            head = _head_without_offer(method, self.url, self.parser.get_http_version(), self.headers)
            self.parser = httptools.HttpRequestParser(self)
            self._set_lenient_version()
            self._framing.restart(self._messages)
            self.data_received(head + rest)

        def _answer_connect(self, rest: bytes) -> None:
            """Have the app answer the CONNECT whose head was just parsed (the module's docstring), with
            no body, then close the connection, lingering; `rest`, what came after the head, is dropped
            (it counts against `_LINGER_BYTES`), and so is whatever follows, while the answer waits."""
            target = _connect_target(self.url)
            if target is None:
                self.send_400_response("malformed HTTP/1.1 request: the CONNECT's target is no URL")
                return
            if len(self.pipeline) >= MAX_PIPELINED:
                self._refuse(*self._error_answer(ErrorCode.OVERLOADED, _TOO_MANY_PIPELINED))
                self._drop(len(rest))
                return
            self._offered_upgrade = False
            self.url = target
            # (uvicorn would take a WebSocket offer beside it for a switch, and start no request)
            self.headers[:] = [(name, value) for name, value in self.headers if name != b"upgrade"]
            self._begin_request(0)
            cycle: Any = self.cycle
            cycle.keep_alive = False  # its answer says `Connection: close`, which closes lingering
            super().on_message_complete()  # (its body: none)
            self._refusal = b""  # nothing of its own to write: the app's answer, then the lingering close
            self._linger_left = _LINGER_BYTES
            self._drop(len(rest))

        def pause_writing(self) -> None:
            """The transport's buffer passed its high-water mark: the client reads slower than it is
            answered, or not at all. Writing paused for `head_timeout_s` with no byte of the buffer read
            meanwhile aborts the connection (the module's docstring): closing would wait for the buffer to
            drain, which may never come."""
            super().pause_writing()
            if head_timeout_s is not None and self._write_timer is None:
                self._arm_write_timer(self.transport.get_write_buffer_size(), _kernel_unsent(self.transport))

        def resume_writing(self) -> None:
            self._cancel_write_timer()
            super().resume_writing()
            self._bound_close()  # (closing: what is left below the low-water mark is bounded too)

        def _arm_write_timer(self, unsent: int, kernel_unsent: int | None) -> None:
            """Check in `head_timeout_s` that the client read some of what is unsent now: `unsent` bytes
            in the transport's buffer, `kernel_unsent` in its socket's send queue (`_write_timed_out`)."""
            assert head_timeout_s is not None
            self._write_left = unsent
            self._kernel_left = kernel_unsent
            self._write_timer = self.loop.call_later(head_timeout_s, self._write_timed_out)

        def _cancel_write_timer(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_timed_out(self) -> None:
            """Writing paused, or a close waiting for unsent answers (`_bound_close`), for `head_timeout_s`.
            Where the client read some of the buffer meanwhile it gets another period: uvicorn writes an
            answer whole, so the buffer of a large answer stays over its high-water mark until nearly all
            of it is read, and a slow reader making progress had been cut off mid-answer. Where it read
            none, the connection is aborted (`connection_lost`), logged, and the request whose send()
            waits for the buffer to drain returns from it, as for a client that left: recorded as a 499
            where no byte of its answer was written (it had read 200).

            Bytes the kernel sent count as read too: the transport's buffer drains only when the kernel's
            send buffer frees a large share of itself, and the answers to pipelined requests refill it,
            so a steady reader of large answers through a small receive window could see the buffer no
            smaller at the check and be aborted (40 pipelined `/openapi.json` read 32 KB each 0.1 s, cut
            off after 27 s). The kernel's queue is asked only when the timer is armed and when it fires,
            once a period; where it cannot be (`_kernel_unsent`), the transport's buffer alone decides."""
            self._write_timer = None
            left = self.transport.get_write_buffer_size()
            kernel_left = _kernel_unsent(self.transport)
            before = self._kernel_left
            kernel_sent = kernel_left is not None and before is not None and kernel_left < before
            if left < self._write_left or kernel_sent:
                self._arm_write_timer(left, kernel_left)
                return
            running = self._running
            if running is not None and not running.response_started:
                running.scope[PROTOCOL_STATUS_KEY] = 499
            self.logger.warning(
                "a client read nothing of its answers for %g s: its connection is aborted (%d bytes unsent)",
                head_timeout_s,
                left,
            )
            self.transport.abort()

        def _arm_head_timer(self) -> None:
            if head_timeout_s is not None and self._head_timer is None:
                self._head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            """No head within `head_timeout_s`: close the connection (408 where part of one came), but
            never under a request still being answered (a pipelined head behind it waits for it)."""
            self._head_timer = None
            if self.transport.is_closing():
                return
            running = self._running
            if running is not None and not running.response_complete:
                self._arm_head_timer()
                return
            if self._in_head:  # (a client still sending its head may have more on the way: lingering)
                message = f"the request head did not arrive within {head_timeout_s:g} s"
                message += " (HTMLLM_HEAD_TIMEOUT_S)"
                self._refuse(*self._error_answer(ErrorCode.HEAD_TIMEOUT, message))
                return
            self._close()

    return BoundedHttpToolsProtocol

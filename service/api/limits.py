"""Cheap checks before expensive work: the body size cap (before any parsing) and the document cap.

`BodyLimitMiddleware` reads the body itself, so the cap holds for a declared `Content-Length` (refused
before a byte is read) and for chunked bodies alike (refused as soon as the running total passes it);
the app then sees the body replayed and, after it, the connection's real messages, so a disconnect is
still noticed while the request waits in the batcher. Only requests to a route that takes a body
(`body_routes`: the model routes' POSTs) are read: any other (a GET, a 404, a 405) is answered without a
byte of its body read, decoded or charged, and the HTTP parser discards what of it comes after the
answer (the answer closes the connection where the client waits for `100 Continue` before sending
it). Reading them let anyone, with no key, hold the budget below with bodies nothing would use.

A body that does not arrive within `body_timeout_s` is answered 408 and its connection closed: uvicorn
times out idle connections only, so a client stalled mid-body held its connection, and what it had sent,
without end. One that sends nothing for `STALL_TIMEOUT_S` (at most `body_timeout_s`) gets that 408 then.

The bodies held at once are bounded too (`BodyBudget`, `max_inflight_bytes`): the queue bounds
documents, not bytes, and 150 concurrent 15 MB pages took a server to 6.5 GB, past the chart's memory
limit, where the kernel's OOM killer would lose every accepted request. A body is charged for the bytes
that came, as they come (a compressed one at its decoded size, a JSON one also for the strings parsed
from it) until its response is sent, never for what its `Content-Length` only declares: charging that
at once let 32 request heads of 100 bytes, each declaring 16 MiB and sending none of it, fill the
default 512 MiB for the body timeout, and every other client got 429. A declared length still refuses
early what cannot fit in what is free now, before the client uploads a byte of it. A body that would
pass the budget gets 429 with `Retry-After`, as a full queue does, once its body has been read and
dropped; it gives back what it held before the rest is dropped, so the concurrent uploads that fit
without it are served (kept, it pushed them all past the budget: three 12 MiB uploads against 32 MiB
all failed). Only a body that would be taken alone gets that 429: one that passes `max_body_bytes` (so
the budget, at least as large) while its rest is dropped gets the 413 an idle server gives it, then and
there, whatever the others hold. A chunked body's size is learnt only as it comes, and it had the 429,
which its client retries for ever, where it could never be taken. What a refused body would decode to,
or parse to (a JSON body's strings), is not learnt: what is dropped is neither kept nor decoded, so a
compressed body refused on its compressed bytes, or a JSON body refused before it was parsed, still
gets the 429 where an idle server would find it too large.

It also undoes a request's `Content-Encoding` (gzip, deflate, br, zstd; at most four, `MAX_CODINGS`),
so every route reads plain bytes. The cap holds for the decoded body too, checked while decoding: a
small gzip bomb is refused with 413 after at most `max_body_bytes` of output, never inflated in full.
A small body is decoded on the event loop only while its output stays small (`INLINE_DECODED_BYTES`):
its compressed size says nothing of the work, and 49,770 bytes of stacked gzip held the loop 8.6 s.
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Callable, Collection, Sized
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import STATUS, error_response, log_unserved
from service.api.http_protocol import UNREAD_BODY_CLOSES_KEY, UNREAD_BODY_KEPT
from service.api.metrics import ServiceMetrics
from service.api.request_id import request_id
from service.api.runtime import CHARGE_KEY, CONTENT_ENCODING_KEY, BodyReaders
from service.core.content_coding import ContentCodingError, decode_content
from service.core.errors import ErrorCode, HtmllmError

# Compressed bodies above this are decoded on a worker thread, off the event loop; smaller ones on the
# loop (a thread hop costs more than they do) until their output passes INLINE_DECODED_BYTES, when they
# are decoded again on a thread. The loop then spends at most about 2 ms on one (four layers of 1 MiB).
INLINE_DECODE_BYTES = 64 * 1024
INLINE_DECODED_BYTES = 1024 * 1024
_LIMIT_NAME = "HTMLLM_MAX_BODY_BYTES"  # the setting a too-large message tells the reader to raise
_BUDGET_NAME = "HTMLLM_MAX_INFLIGHT_BYTES"
# A body none of which came for this long (at most the body timeout) gets its 408 then, not at the body
# timeout: a client with bytes to send sends some every second or so (TCP's retransmissions back off 1,
# 2, 4 s), and one that sends none holds its connection, and what it sent, for nothing. Not a setting:
# nothing legitimate waits this long between two pieces of a page it already has.
STALL_TIMEOUT_S = 10.0


class BodyBudget:
    """The bytes of request bodies held by requests not yet answered, against `limit`.

    Only the event loop touches it (no lock): `take` and `give` run between awaits.
    """

    def __init__(self, limit: int, metrics: ServiceMetrics) -> None:
        self.limit = limit
        self.held = 0
        self._gauge = metrics.body_bytes_in_flight

    def take(self, count: int) -> bool:
        """Charge `count` more bytes if they fit; False (nothing charged) if they do not."""
        if self.held + count > self.limit:
            return False
        self.held += count
        self._gauge.set(self.held)
        return True

    def give(self, count: int) -> None:
        self.held -= count
        self._gauge.set(self.held)

    def fits(self, count: int) -> bool:
        """Whether `count` more bytes would fit now (nothing charged)."""
        return self.held + count <= self.limit

    def refusal(self, count: int) -> str:
        return (
            f"the server holds {self.held} bytes of request bodies and {count} more would pass its "
            f"{self.limit} ({_BUDGET_NAME}); retry later"
        )


@dataclass
class _Charge:
    """The bytes one request is charged for, given back when it is answered (then `closed`)."""

    held: int
    closed: bool = False


class _Rest(enum.Enum):
    """How the drop of a refused body's rest ended (`BodyLimitMiddleware._drop_rest`)."""

    READ = enum.auto()  # to the body's end
    TOO_LARGE = enum.auto()  # past `max_body_bytes`: what is left of it is not read
    UNFINISHED = enum.auto()  # past its deadline, or cut off by shutdown: the rest may still come
    LEFT = enum.auto()  # the client left


@dataclass
class _Upload:
    """When a body's upload times out, in the event loop's time: at `whole` (its body timeout), or
    `stall` seconds after the last byte came, whichever is sooner."""

    whole: float
    stall: float

    @classmethod
    def starting(cls, body_timeout_s: float, stall_s: float) -> _Upload:
        return cls(whole=asyncio.get_running_loop().time() + body_timeout_s, stall=stall_s)

    def deadline(self) -> float:
        """The deadline, in the loop's time, as the last byte came now (or none has come yet): for
        `asyncio.timeout_at` and `reschedule`, never `asyncio.timeout`, which takes a delay (given this,
        a body none of which came waited about twice the loop's age, hours)."""
        return min(self.whole, asyncio.get_running_loop().time() + self.stall)

    def stalled(self) -> bool:
        """Whether a deadline that passed was the stall's, not the whole body's."""
        return asyncio.get_running_loop().time() < self.whole


class BodyLimitMiddleware:
    """Refuses bodies over `max_body_bytes` with 413 and the usual error body, and bodies that would
    pass the in-flight budget with 429; reads only the bodies of `body_routes` ((method, path); None:
    every request's)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        metrics: ServiceMetrics,
        max_inflight_bytes: int,
        retry_after_s: int,
        readers: BodyReaders,
        body_timeout_s: float = 60.0,
        gate: Callable[[Scope], HtmllmError | None] | None = None,
        body_routes: Collection[tuple[str, str]] | None = None,
    ) -> None:
        self.app = app
        self.gate = gate  # what refuses a request before its body is read (the API key: service.api.auth)
        self.body_routes = body_routes
        self.readers = readers
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.stall_timeout_s = min(body_timeout_s, STALL_TIMEOUT_S)
        self.metrics = metrics
        self.budget = BodyBudget(max_inflight_bytes, metrics)
        self.retry_after_s = retry_after_s

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        code: ErrorCode,
        message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        response = error_response(
            code,
            message,
            STATUS[code],
            metrics=self.metrics,
            headers=headers,
            retry_after_s=self.retry_after_s,
        )
        await response(scope, receive, send)

    async def _cut_off(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        """503 for a request whose body had not all come when shutdown cut off the body reads (the rest
        may still come: its connection cannot carry another request)."""
        message = (
            "the server is shutting down and the request body did not arrive before its drain budget "
            f"ended ({size} bytes came): send it again"
        )
        headers = {"connection": "close"}
        # Answered here, before the exception handler that logs the other 503s with their request id.
        log_unserved(scope["method"], scope["path"], ErrorCode.SHUTTING_DOWN, request_id(scope), message)
        await self._refuse(scope, receive, send, ErrorCode.SHUTTING_DOWN, message, headers=headers)

    async def _over_budget(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        refusal: str,
        upload: _Upload,
        *,
        more_body: bool,
        read: bool,
        size: int = 0,
    ) -> None:
        """429 (`refusal`, as the budget stood when the body was refused: it changes while the rest is
        dropped) for a body that would pass the budget, after reading and dropping what is left of it:
        a client still sending its body reads no response (most end in a reset connection and retry at
        once, unpaced), while one that drained learns to wait `Retry-After`. A client that asked
        `Expect: 100-continue` and whose body nothing has `read` yet has not been told to send it, and
        is answered at once; one that stalls mid-body, passes the request's body timeout (`upload`,
        counted from its head) or is still sending when shutdown cuts off the body reads is answered
        and its connection closed. Nothing of what is dropped is charged.

        A body that passes `max_body_bytes` while it is dropped (`size` of it came before) could never
        be taken, even alone: it gets the 413 an idle server gives it, as soon as it does, not a 429 that
        its client would retry for ever.

        Called outside any timeout of the body's read: inside one, whose deadline no longer moves once
        the body is refused, a client that kept sending got the stall's 408 instead."""
        headers = None
        if more_body:
            expecting = dict(scope["headers"]).get(b"expect", b"").lower() == b"100-continue"
            if expecting and not read:
                headers = {"connection": "close"}
            else:
                rest, size = await self._drop_rest(receive, upload, size)
                if rest is _Rest.LEFT:
                    return  # the client left: there is no one to answer
                if rest is _Rest.TOO_LARGE:  # (what is left of it is not read: the connection closes)
                    too_large = _too_large(f"over {size} bytes", self.max_body_bytes)
                    closing = {"connection": "close"}
                    await self._refuse(scope, receive, send, ErrorCode.PAYLOAD_TOO_LARGE, too_large, closing)
                    return
                if rest is _Rest.UNFINISHED:  # the connection cannot carry another request
                    headers = {"connection": "close"}
        await self._refuse(scope, receive, send, ErrorCode.OVERLOADED, refusal, headers)

    async def _drop_rest(self, receive: Receive, upload: _Upload, size: int) -> tuple[_Rest, int]:
        """Read the rest of the body, keeping none of it, counting it on from `size` (what came before):
        how that ended (`_Rest`: read to its end, past the cap, past `upload`'s deadline (stalled, or
        past the body timeout) or cut off by shutdown, or left by its client), and the body's size then.

        Its waits are the `readers`' as `_read`'s are: unseen by the cut-off, a drain still going when
        uvicorn's graceful timeout ran out was cancelled into a bare plain-text 500. Cut off, the 429
        already decided is sent (its connection closed), not `_cut_off`'s 503: the body was refused for
        the budget, not for the shutdown."""
        try:
            async with asyncio.timeout_at(upload.deadline()) as timeout:
                while True:
                    if self.readers.closed:  # cut off: no wait that starts now would be
                        return _Rest.UNFINISHED, size
                    message = await self.readers.receive(receive)
                    if message["type"] == "http.disconnect":
                        return _Rest.LEFT, size
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        return _Rest.TOO_LARGE, size
                    if not message.get("more_body", False):
                        return _Rest.READ, size
                    if chunk:
                        timeout.reschedule(upload.deadline())
        except asyncio.CancelledError:
            if not self.readers.was_cut(asyncio.current_task()):
                raise
            return _Rest.UNFINISHED, size
        except TimeoutError:
            return _Rest.UNFINISHED, size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = _declared_length(headers)  # parsed once, for `unread` and for the cap and budget below
        # The `send` of every answer given before a byte of the body is read (`_unread_body_send`).
        unread = _unread_body_send(scope, headers, declared, send)
        if self.gate is not None and (gated := self.gate(scope)) is not None:
            # Before a byte of the body is read or charged: the client's upload, if any, is discarded by
            # the parser after this answer, and the connection carries the next request (unless the
            # client waits for `100 Continue`: `_unread_body_send`).
            await self._refuse(scope, receive, unread, gated.code, gated.message)
            return
        if self.body_routes is not None and (scope["method"], scope["path"]) not in self.body_routes:
            # No route here reads a body (a GET, a 404, a 405): none of it is read, decoded or charged.
            # What of it comes after the answer the parser discards; the connection carries the next
            # request, as after the gate's 401.
            await self.app(scope, _without_body(receive), unread)
            return
        limit = self.max_body_bytes
        length = 0
        if declared is not None:
            if declared == _INVALID_LENGTH:
                # Answered before a byte of the body is read, as below: the connection closes where the
                # client waits for `100 Continue` (kept, the parser read its next request as this body).
                await self._refuse(scope, receive, unread, ErrorCode.VALIDATION, "invalid Content-Length")
                return
            length = declared
            if length > limit:
                too_large = _too_large(f"{length} bytes", limit)
                await self._refuse(scope, receive, unread, ErrorCode.PAYLOAD_TOO_LARGE, too_large)
                return
        upload = _Upload.starting(self.body_timeout_s, self.stall_timeout_s)  # timed from the head
        if not self.budget.fits(length):  # refused before the client uploads a byte of it
            refusal = self.budget.refusal(length)
            await self._over_budget(scope, receive, send, refusal, upload, more_body=True, read=False)
            return
        # Nothing is charged before a byte came: what a head declares costs the client nothing to send.
        charge = _Charge(0)
        try:
            body = await self._read(scope, receive, send, charge, upload)
            if body is None:
                return
            # Repeated Content-Encoding headers are one list, in order (RFC 9110 §5.3).
            codings = [v.decode("latin-1") for k, v in scope["headers"] if k == b"content-encoding"]
            if codings and body:  # nothing to decode in an empty body (a GET), whatever it claims
                try:
                    body = await _decode(body, ", ".join(codings), limit)
                except ContentCodingError as exc:
                    await self._refuse(scope, receive, send, exc.code, exc.message)
                    return
                scope = _plain_scope(scope, len(body))
                scope[CONTENT_ENCODING_KEY] = ", ".join(codings)  # what was undone (a body still compressed)
                if not self._charge_up_to(len(body), charge):  # the decoded body is what it holds now
                    refusal = self.budget.refusal(len(body) - charge.held)
                    await self._over_budget(scope, receive, send, refusal, upload, more_body=False, read=True)
                    return
            scope[CHARGE_KEY] = functools.partial(self._charge_more, charge)
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            charge.closed = True
            self._give_back(charge)

    def _charge_more(self, charge: _Charge, count: int) -> None:
        """What a route adds to its request's charge: what the body became (the JSON's strings).

        A request that alone needs more than the whole budget could never be taken: 413, not a 429
        that a client would retry forever."""
        if charge.closed:
            raise HtmllmError("the request was answered already", code=ErrorCode.INTERNAL)
        if charge.held + count > self.budget.limit:
            raise HtmllmError(
                f"the request's documents take {charge.held + count} bytes once parsed (its body and "
                f"the text in it), more than the {self.budget.limit} the server holds for all requests "
                f"at once ({_BUDGET_NAME}): send fewer or smaller documents per request",
                code=ErrorCode.PAYLOAD_TOO_LARGE,
            )
        if not self._charge_up_to(charge.held + count, charge):
            raise HtmllmError(self.budget.refusal(count), code=ErrorCode.OVERLOADED)

    def _give_back(self, charge: _Charge) -> None:
        """Give back all `charge` holds (it holds nothing after)."""
        self.budget.give(charge.held)
        charge.held = 0

    def _charge_up_to(self, size: int, charge: _Charge) -> bool:
        """Charge the request for `size` bytes in all, if they fit the budget."""
        if size <= charge.held:
            return True
        if not self.budget.take(size - charge.held):
            return False
        charge.held = size
        return True

    async def _read(
        self, scope: Scope, receive: Receive, send: Send, charge: _Charge, upload: _Upload
    ) -> bytes | None:
        """The whole body, charged as it comes, by `upload`'s deadline; None once the request has been
        answered, or its client left."""
        limit = self.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        if self.readers.closed:  # after the cut-off: answered as the cut-off answers those it found
            await self._cut_off(scope, receive, send, size)
            return None
        # Decided inside the timeout, answered after it: its deadline stops moving once the body is
        # refused, and a refusal that drops the rest (`_over_budget`) keeps its own.
        too_large: str | None = None
        refusal: str | None = None
        more_body = False
        try:
            # A client that stalls mid-body would hold its connection and what it sent (up to the cap)
            # for as long as it likes: uvicorn times out idle connections, not slow bodies.
            async with asyncio.timeout_at(upload.deadline()) as timeout:
                while True:
                    message = await self.readers.receive(receive)
                    if message["type"] == "http.disconnect":
                        return None  # the client left before sending its body: there is no one to answer
                    chunk = message.get("body", b"")
                    if chunk:
                        timeout.reschedule(upload.deadline())
                    size += len(chunk)
                    more_body = message.get("more_body", False)
                    if size > limit:
                        too_large = _too_large(f"over {size} bytes", limit)
                        break
                    if not self._charge_up_to(size, charge):
                        refusal = self.budget.refusal(size - charge.held)
                        # Nothing of it is held while the rest is dropped (up to the body timeout): kept,
                        # its charge pushed every concurrent upload past the budget too, and all failed
                        # where those that fit without it would have been served.
                        chunks.clear()
                        self._give_back(charge)
                        break
                    chunks.append(chunk)
                    if not more_body:
                        break
        except asyncio.CancelledError:
            if not self.readers.was_cut(asyncio.current_task()):
                raise
            await self._cut_off(scope, receive, send, size)
            return None
        except TimeoutError:
            if upload.stalled():
                message_text = (
                    f"the request body stalled: no byte of it came for {self.stall_timeout_s:g} s "
                    f"({size} bytes came in all)"
                )
            else:
                message_text = (
                    f"the request body did not arrive within {self.body_timeout_s:g} s "
                    f"({size} bytes came; HTMLLM_BODY_TIMEOUT_S)"
                )
            # The rest of the body may still come: the connection cannot carry another request.
            await self._refuse(
                scope, receive, send, ErrorCode.BODY_TIMEOUT, message_text, headers={"connection": "close"}
            )
            return None
        if too_large is not None:
            # The rest of the body is not read: the connection closes after the answer, which says so.
            closing = {"connection": "close"} if more_body else None
            await self._refuse(scope, receive, send, ErrorCode.PAYLOAD_TOO_LARGE, too_large, closing)
            return None
        if refusal is not None:
            await self._over_budget(
                scope, receive, send, refusal, upload, more_body=more_body, read=True, size=size
            )
            return None
        return b"".join(chunks)  # the chunks go with this frame: the request holds the body once


async def _decode(body: bytes, coding: str, limit: int) -> bytes:
    """`body` with `coding` undone, on the event loop while that stays cheap, else on a worker thread."""
    if len(body) <= INLINE_DECODE_BYTES:
        inline_limit = min(limit, INLINE_DECODED_BYTES)
        try:
            return decode_content(body, coding, limit=inline_limit, limit_name=_LIMIT_NAME)
        except ContentCodingError as exc:
            if exc.code is not ErrorCode.PAYLOAD_TOO_LARGE or inline_limit == limit:
                raise
            # Past what is worth the loop's time, not past the limit: start again off the loop.
    return await asyncio.to_thread(decode_content, body, coding, limit=limit, limit_name=_LIMIT_NAME)


def _without_body(receive: Receive) -> Receive:
    """`receive` for a request whose body is not read: an empty body, then the connection's messages
    other than its body (a disconnect), whatever of the body they bring dropped unkept."""
    given = False

    async def without_body() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": b"", "more_body": False}
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message

    return without_body


def _unread_body_send(scope: Scope, headers: dict[bytes, bytes], declared: int | None, send: Send) -> Send:
    """`send` for an answer given without reading the body: one that says `Connection: close` (and so
    closes its connection) where the client declared a body (`headers`, and their Content-Length
    `declared`: `_declared_length`) and waits for `100 Continue` before sending it.

    Such a client, never told to go on, may send its body or not (RFC 9110 §10.1.1): the parser,
    waiting for the declared body, took the next request on the connection for it (a 5000-byte
    `Content-Length` swallowed a pipelined request whole, and its client timed out). Closed, nothing
    on the connection is read as anything else; a client that sends no body is not kept waiting.

    Also one that leaves so much of its body unread that the HTTP protocol closes the connection after
    it rather than read the rest (`service.api.http_protocol`, asked when the answer starts: what is
    still to come then decides): the answer says so, as RFC 9112 §9.6 asks (a pooling client had reused
    the connection and lost its next request). Under another protocol (h11), a chunked body or one
    declaring more than `UNREAD_BODY_KEPT`."""
    if not _declares_body(headers, declared):
        return send
    expecting = headers.get(b"expect", b"").lower() == b"100-continue"
    closes: Callable[[], bool] | None = scope.get(UNREAD_BODY_CLOSES_KEY)
    if closes is None:
        large = b"transfer-encoding" in headers or (declared is not None and declared > UNREAD_BODY_KEPT)
        closes = functools.partial(bool, large)
    return _closing_send(send, when=lambda: expecting or closes())


def _closing_send(send: Send, *, when: Callable[[], bool]) -> Send:
    """`send` with the answer's head saying `Connection: close` (uvicorn then closes after it) where
    `when()` says so as the answer starts."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start" and when():
            kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
            message = {**message, "headers": [*kept, (b"connection", b"close")]}
        await send(message)

    return closing


# What `_declared_length` gives for a Content-Length that is no length (a negative one included).
_INVALID_LENGTH = -1


def _declared_length(headers: dict[bytes, bytes]) -> int | None:
    """A request head's Content-Length: None where it has none, `_INVALID_LENGTH` where it is no count of
    bytes. The HTTP parsers refuse such a head before any app sees it; the cap, the budget and the
    connection's fate must not depend on that."""
    declared = headers.get(b"content-length")
    if declared is None:
        return None
    try:
        length = int(declared)
    except ValueError:
        return _INVALID_LENGTH
    return length if length >= 0 else _INVALID_LENGTH


def _declares_body(headers: dict[bytes, bytes], declared: int | None) -> bool:
    """Whether a request head says a body follows: chunked, or a Content-Length (`declared`) other than
    0; an invalid one is taken to (`_INVALID_LENGTH`: the parser refuses it, and were it not, a body
    may follow)."""
    return b"transfer-encoding" in headers or (declared is not None and declared != 0)


def _plain_scope(scope: Scope, length: int) -> Scope:
    """The scope as if the decoded body had been sent: no Content-Encoding, its real Content-Length."""
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
    headers.append((b"content-length", str(length).encode("ascii")))
    return {**scope, "headers": headers}


def _too_large(size: str, limit: int) -> str:
    return f"the request body is {size}; the limit is {limit} bytes ({_LIMIT_NAME})"


def check_document_count(documents: Sized, max_documents: int) -> None:
    """400 for no documents, 422 for more than a request may carry."""
    count = len(documents)
    if count == 0:
        raise HtmllmError("the request has no documents", code=ErrorCode.EMPTY)
    if count > max_documents:
        raise HtmllmError(
            f"the request has {count} documents; the limit is {max_documents} (HTMLLM_MAX_DOCUMENTS): send "
            f"them in requests of at most {max_documents} (an OpenAI client's batch, langchain's chunk_size, "
            "llama-index's embed_batch_size)",
            code=ErrorCode.TOO_MANY_DOCUMENTS,
        )

"""Response compression that honours the client's `Accept-Encoding` weights.

Starlette's `GZipMiddleware` compresses whenever the header contains the letters "gzip", so a client
that says `gzip;q=0` (RFC 9110 §12.5.3: "not acceptable") still gets gzip, and one whose HTTP stack
cannot inflate (some embedded crawlers, a debugging proxy) has no way to opt out; and it reads the
letters case-sensitively, so `GZIP` went uncompressed. Here the header is parsed, case-insensitively:
the response is gzipped only when gzip (or its alias x-gzip) is listed with a weight above 0; everything
else passes through uncompressed, as before for a header without gzip (a bare `*` is not taken as gzip,
as nginx does not). The compression itself is Starlette's (its streaming, minimum size and excluded
content types).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import Receive, Scope, Send

_GZIP_NAMES = frozenset({"gzip", "x-gzip"})


def _weight(parameters: list[str]) -> float:
    """A coding's `q` parameter (1 when absent); a malformed weight counts as 0, the safe reading."""
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                weight = float(value.strip())
            except ValueError:
                return 0.0
            return weight if 0.0 <= weight <= 1.0 else 0.0
    return 1.0


def accepts_gzip(header: str) -> bool:
    """Whether an `Accept-Encoding` value lets the response be gzipped."""
    weights = [
        _weight(parameters)
        for coding, *parameters in (item.split(";") for item in header.split(","))
        if coding.strip().lower() in _GZIP_NAMES
    ]
    return bool(weights) and max(weights) > 0


def _lowercase_accept_encoding(scope: Scope) -> Scope:
    """`scope` with its `Accept-Encoding` values lower-cased: content-codings are case-insensitive (RFC
    9110 §8.4.1), but Starlette looks for the letters "gzip" as they are, and answered `GZIP` uncompressed
    (while saying `Vary: Accept-Encoding`). Lower-cased, every coding and weight reads the same."""
    headers = [
        (name, value.lower()) if name == b"accept-encoding" else (name, value)
        for name, value in scope["headers"]
    ]
    return {**scope, "headers": headers}


class NegotiatedGZipMiddleware(GZipMiddleware):
    """`GZipMiddleware`, skipped for requests whose `Accept-Encoding` does not accept gzip, whatever the
    case of its letters."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if not accepts_gzip(Headers(scope=scope).get("accept-encoding", "")):
            await self.app(scope, receive, send)
            return
        await super().__call__(_lowercase_accept_encoding(scope), receive, send)

"""`Accept-Encoding` negotiation for gzipped responses (service/api/compression.py)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from service.api.compression import NegotiatedGZipMiddleware, accepts_gzip


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        ("gzip", True),
        ("GZip", True),
        ("gzip, deflate, br", True),
        ("br;q=1.0, gzip;q=0.8, *;q=0.1", True),
        ("x-gzip", True),
        ("gzip ; q=0.5", True),
        ("gzip;q=0", False),
        ("gzip;q=0.000", False),
        ("gzip; Q=0", False),
        ("br, gzip;q=0", False),
        ("gzip;q=0, x-gzip;q=0.5", True),
        ("gzip;q=nonsense", False),
        ("gzip;q=2", False),
        ("gzip;q=nan", False),
        ("identity", False),
        ("", False),
        ("*", False),
        ("deflate, br", False),
        ("notgzip", False),
    ],
)
def test_accepts_gzip_reads_weights(header: str, accepted: bool) -> None:
    assert accepts_gzip(header) is accepted


def _app() -> NegotiatedGZipMiddleware:
    """A page large enough to be gzipped, behind the middleware, and the Accept-Encoding it was given."""

    async def page(request: Request) -> Response:
        return PlainTextResponse("x" * 2000, headers={"x-seen": request.headers.get("accept-encoding", "")})

    return NegotiatedGZipMiddleware(Starlette(routes=[Route("/", page)]), minimum_size=500)


@pytest.mark.parametrize("header", ["gzip", "GZIP", "Gzip", "br, GZip;q=0.5", "X-GZIP"])
async def test_any_case_of_gzip_gets_gzip(header: str) -> None:
    """Content-codings are case-insensitive (RFC 9110 §8.4.1): `GZIP` was answered uncompressed."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as client:
        response = await client.get("/", headers={"accept-encoding": header})
    assert (
        response.headers.get("content-encoding") == "gzip" and response.headers["vary"] == "Accept-Encoding"
    )
    assert response.text == "x" * 2000  # httpx inflated it
    assert response.headers["x-seen"] == header.lower()


@pytest.mark.parametrize("header", ["GZIP;q=0", "Gzip;Q=0", "identity", ""])
async def test_refused_gzip_in_any_case_gets_no_gzip(header: str) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://t") as client:
        response = await client.get("/", headers={"accept-encoding": header})
    assert "content-encoding" not in response.headers and response.text == "x" * 2000

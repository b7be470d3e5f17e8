"""Raw bodies as crawlers forward them: an origin's Content-Type as it came (XHTML and XML types, two
headers a proxy merged into one) read with its charset, and a body stored compressed, sent without a
Content-Encoding, refused with a 415 that names the header instead of embedded as binary noise."""

from __future__ import annotations

import gzip
import zlib

import httpx
import pytest
import zstandard

from tests.api.pages import page

# One event loop for the module, so the shared `client` app (and its engine) lives across tests.
pytestmark = pytest.mark.asyncio(loop_scope="module")

RUSSIAN_TEXT = "Съешь же ещё этих мягких французских булок"
# Its <meta> says windows-1251: only the header's koi8-r, which outranks it, reads it right.
KOI8_PAGE = (
    '<html><head><meta charset="windows-1251"><title>Новости</title></head>'
    f"<body><p>{RUSSIAN_TEXT}, да выпей чаю.</p></body></html>"
)
ROUTES = ("/v1/embed", "/v1/preprocess", "/v1/extract")


def _preprocessed(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    html: str = response.json()["data"][0]["html"]
    return html


@pytest.mark.parametrize(
    "content_type",
    [
        "application/xhtml+xml; charset=koi8-r",
        "text/xml; charset=koi8-r",
        "application/xml; charset=KOI8-R",
        "text/html, text/html; charset=koi8-r",  # two headers a proxy merged (Fetch: koi8-r)
        "text/html; charset=koi8-r, text/html",
        '*/*, text/html; foo="a, b"; charset=koi8-r',
    ],
)
async def test_page_types_as_crawled_keep_their_charset(client: httpx.AsyncClient, content_type: str) -> None:
    """They were 415; now read as text/html with the charset they declare (which outranks detection)."""
    response = await client.post(
        "/v1/preprocess", content=KOI8_PAGE.encode("koi8-r"), headers={"content-type": content_type}
    )
    html = _preprocessed(response)
    assert RUSSIAN_TEXT in html and "\ufffd" not in html


async def test_two_headers_of_one_type_read_as_their_merged_form(client: httpx.AsyncClient) -> None:
    """RFC 9110 §5.3: the same list whether a proxy merged the lines or not; they had been a 415."""
    headers = [("content-type", "text/html"), ("content-type", "text/html; charset=koi8-r")]
    response = await client.post("/v1/preprocess", content=KOI8_PAGE.encode("koi8-r"), headers=headers)
    assert RUSSIAN_TEXT in _preprocessed(response)


async def test_a_merged_header_of_different_types_is_a_415(client: httpx.AsyncClient) -> None:
    """As two headers naming them are: which one the client meant is a guess (JSON or a page)."""
    body = b'{"documents": [{"html": "<p>hi</p>"}]}'
    for value in ("text/html, application/json", "application/json, text/html"):
        response = await client.post("/v1/embed", content=body, headers={"content-type": value})
        assert response.status_code == 415, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_media_type" and "different media types" in error["message"]


async def test_other_xml_types_stay_refused(client: httpx.AsyncClient) -> None:
    for value in ("image/svg+xml", "application/rss+xml", "text/plain; charset=utf-8"):
        response = await client.post("/v1/preprocess", content=page(1), headers={"content-type": value})
        assert response.status_code == 415, (value, response.text)


COMPRESSED = {
    "gzip": gzip.compress(page(1).encode()),
    "deflate": zlib.compress(page(1).encode()),
    "zstd": zstandard.ZstdCompressor().compress(page(1).encode()),
}


@pytest.mark.parametrize("coding", sorted(COMPRESSED))
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/octet-stream", None])
async def test_a_body_compressed_without_content_encoding_is_a_415(
    client: httpx.AsyncClient, coding: str, route: str, content_type: str | None
) -> None:
    """It was embedded (and pruned, and extracted) as binary noise, answered 200."""
    headers = {"content-type": content_type} if content_type else {}
    response = await client.post(route, content=COMPRESSED[coding], headers=headers)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert f"Content-Encoding: {coding}" in error["message"]


@pytest.mark.parametrize("route", ["/v1/embed", "/v1/embeddings"])
async def test_compressed_json_without_content_encoding_says_so(
    client: httpx.AsyncClient, route: str
) -> None:
    """Not "Invalid JSON ... line 1 column 1", which sent the client looking for a syntax error."""
    body = gzip.compress(b'{"documents": [{"html": "<p>hi</p>"}], "input": "<p>hi</p>"}')
    response = await client.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 415, response.text
    assert "Content-Encoding: gzip" in response.json()["error"]["message"]


@pytest.mark.parametrize("coding", sorted(COMPRESSED))
async def test_the_same_body_with_its_content_encoding_is_read(
    client: httpx.AsyncClient, coding: str
) -> None:
    headers = {"content-type": "text/html; charset=utf-8", "content-encoding": coding}
    response = await client.post("/v1/preprocess", content=COMPRESSED[coding], headers=headers)
    assert "<p" in _preprocessed(response)


async def test_compressed_twice_and_declared_once_is_still_refused(client: httpx.AsyncClient) -> None:
    """What is left after the declared coding is undone is gzip again: the message names the list."""
    headers = {"content-type": "text/html", "content-encoding": "gzip"}
    response = await client.post("/v1/preprocess", content=gzip.compress(COMPRESSED["gzip"]), headers=headers)
    message = response.json()["error"]["message"]
    assert response.status_code == 415 and "`Content-Encoding: gzip, gzip`" in message, message

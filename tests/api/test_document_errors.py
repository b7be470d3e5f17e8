"""What a raw or JSON request is told about one of its pages: a failing page named by id and index in
all-or-nothing mode, a repeated query option refused, octet-stream's charset parameter ignored."""

from __future__ import annotations

import httpx
import pytest

from tests.api.pages import CZECH_TEXT, page

# One event loop for the module, so the shared `client` app (and its engine) lives across tests.
pytestmark = pytest.mark.asyncio(loop_scope="module")

TOO_DEEP = "<div>" * 9000  # past the pruner's nesting cap (8192)


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    message: str = error["message"]
    return message


async def test_a_failing_page_is_named_by_id_and_index(client: httpx.AsyncClient) -> None:
    docs = [{"id": "good", "html": page(1)}, {"id": "bad-doc", "html": TOO_DEEP}]
    for route in ("/v1/embed", "/v1/preprocess"):
        message = _error(await client.post(route, json={"documents": docs}), 422, "preprocess_failed")
        assert message.startswith("document 'bad-doc' (index 1): page nests more than"), (route, message)
    unnamed = [{"html": page(1)}, {"html": page(2)}, {"html": TOO_DEEP}]
    message = _error(await client.post("/v1/embed", json={"documents": unnamed}), 422, "preprocess_failed")
    assert message.startswith("the document at index 2: page nests more than")


async def test_the_compatible_routes_name_a_failing_page_by_its_index(client: httpx.AsyncClient) -> None:
    pages = [page(1), TOO_DEEP, page(2)]
    openai = await client.post("/v1/embeddings", json={"input": pages})
    assert _error(openai, 422, "preprocess_failed").startswith("the document at index 1: ")
    tei = await client.post("/embed", json={"inputs": pages})
    assert _error(tei, 422, "preprocess_failed").startswith("the document at index 1: ")


async def test_a_raw_page_is_named_by_its_query_id(client: httpx.AsyncClient) -> None:
    raw = await client.post("/v1/embed?id=crawl-7", content=TOO_DEEP, headers={"content-type": "text/html"})
    assert _error(raw, 422, "preprocess_failed").startswith("document 'crawl-7' (index 0): ")


async def test_report_mode_keeps_its_per_document_messages(client: httpx.AsyncClient) -> None:
    docs = [{"id": "good", "html": page(1)}, {"id": "bad-doc", "html": TOO_DEEP}]
    response = await client.post("/v1/embed", json={"documents": docs, "on_error": "report"})
    assert response.status_code == 200, response.text
    error = response.json()["data"][1]["error"]
    assert error["code"] == "preprocess_failed" and error["message"].startswith("page nests more than")


@pytest.mark.parametrize(
    ("route", "query", "option"),
    [
        ("/v1/embed", "normalize=true&normalize=false", "normalize"),
        ("/v1/embed", "id=a&id=b", "id"),
        ("/v1/embed", "encoding_format=base64&encoding_format=float", "encoding_format"),
        ("/v1/embed", "truncate=true&heads=quality&truncate=true", "truncate"),
        ("/v1/preprocess", "id=a&id=b", "id"),
        ("/v1/extract", "min_words=0&min_words=5", "min_words"),
    ],
)
async def test_a_repeated_query_option_is_a_422(
    client: httpx.AsyncClient, route: str, query: str, option: str
) -> None:
    response = await client.post(f"{route}?{query}", content=page(1), headers={"content-type": "text/html"})
    message = _error(response, 422, "validation_error")
    assert f"{option!r} given more than once" in message


async def test_list_query_options_may_repeat(client: httpx.AsyncClient) -> None:
    headers = {"content-type": "text/html"}
    response = await client.post(
        "/v1/embed?heads=quality&heads=quality&id=a", content=page(1), headers=headers
    )
    assert response.status_code == 200, response.text
    extracted = await client.post(
        "/v1/extract?extractors=union&extractors=justext", content=page(1), headers=headers
    )
    assert extracted.status_code == 200, extracted.text


META_1250_PAGE = (
    '<!DOCTYPE html><html><head><meta charset="windows-1250"><title>Zprávy</title></head>'
    f"<body><h1>{CZECH_TEXT}</h1><p>Počasí v Praze: řeka, město, článek.</p></body></html>"
).encode("windows-1250")


@pytest.mark.parametrize(
    "content_type", ["application/octet-stream", "application/octet-stream; charset=utf-8"]
)
async def test_octet_stream_finds_the_encoding_whatever_charset_it_says(
    client: httpx.AsyncClient, content_type: str
) -> None:
    """application/octet-stream defines no charset: the page's own <meta charset> decides."""
    response = await client.post(
        "/v1/preprocess", content=META_1250_PAGE, headers={"content-type": content_type}
    )
    assert response.status_code == 200, response.text
    html = response.json()["data"][0]["html"]
    assert CZECH_TEXT in html and "\ufffd" not in html


async def test_text_html_keeps_its_declared_charset(client: httpx.AsyncClient) -> None:
    """text/html's charset is the HTTP-declared one, which outranks the page's <meta> (the HTML Standard)."""
    headers = {"content-type": "text/html; charset=utf-8"}
    html = (await client.post("/v1/preprocess", content=META_1250_PAGE, headers=headers)).json()["data"][0][
        "html"
    ]
    assert "\ufffd" in html and CZECH_TEXT not in html

"""An empty raw body is 400 `empty_input` on every raw-body route, whatever valid query options come with
it and whether it is typed (text/html, octet-stream) or untyped (`requests.post(url, data=b"")`, a
crawler forwarding an empty fetch). Untyped, it had been read as JSON: 422 "Invalid JSON", and with the
page's `?id=` 422 "query options ['id'] apply to raw bodies only; put them in the JSON body", which sent
the client to a JSON body it never meant to send. An unknown, repeated or invalid option stays a 422.

The routes and their options come from the OpenAPI document, so an option added to a route is covered
here (or fails the test until it has a sample value)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

# One event loop for the module, so the shared `client` app (and its engine) lives across tests.
pytestmark = pytest.mark.asyncio(loop_scope="module")

# A valid value of every raw-body query option, by name (`heads=` is the empty list: no heads).
SAMPLES = {
    "id": "page-1",
    "url": "https://example.com/a",
    "heads": "",
    "normalize": "false",
    "truncate": "true",
    "encoding_format": "base64",
    "on_error": "report",
    "extractors": "trafilatura",
    "min_words": "0",
    "language": "en",
}
# Sent as a crawler sends a page: typed, or untyped (no Content-Type header at all).
CONTENT_TYPES = ("text/html", "text/html; charset=utf-8", "application/octet-stream", None)


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    message: str = error["message"]
    return message


async def _raw_body_options(client: httpx.AsyncClient) -> dict[str, list[str]]:
    """Each raw-body route's query options, as the OpenAPI document lists them."""
    spec: dict[str, Any] = (await client.get("/openapi.json")).json()
    routes = {}
    for path, item in spec["paths"].items():
        operation = item.get("post", {})
        if "text/html" in operation.get("requestBody", {}).get("content", {}):
            routes[path] = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
    assert set(routes) == {"/v1/embed", "/v1/extract", "/v1/preprocess"}, routes
    return routes


def _queries(options: list[str]) -> list[str]:
    """None, each option alone, and all of them together."""
    singles = [f"{name}={SAMPLES[name]}" for name in options]
    return ["", *singles, "&".join(singles)]


async def test_an_empty_raw_body_is_400_whatever_its_options(client: httpx.AsyncClient) -> None:
    routes = await _raw_body_options(client)
    assert {name for options in routes.values() for name in options} <= set(SAMPLES), routes
    for route, options in routes.items():
        for query in _queries(options):
            for content_type in CONTENT_TYPES:
                headers = {} if content_type is None else {"content-type": content_type}
                response = await client.post(f"{route}?{query}", content=b"", headers=headers)
                message = _error(response, 400, "empty_input")
                assert message == "the request body is empty", (route, query, content_type)


@pytest.mark.parametrize(
    ("route", "query", "named"),
    [
        ("/v1/embed", "normalise=false", "normalise"),  # unknown
        ("/v1/preprocess", "url=https://example.com/a", "url"),  # another route's option
        ("/v1/embed", "id=a&id=b", "id"),  # repeated
        ("/v1/extract", "id=a&id=b", "id"),
        ("/v1/preprocess", "id=a&id=b", "id"),
        ("/v1/embed", "normalize=maybe", "normalize"),  # not a value of its type
        ("/v1/embed", "encoding_format=hex", "encoding_format"),
        ("/v1/extract", "min_words=-1", "min_words"),
        ("/v1/extract", "extractors=bogus", "extractors"),
        ("/v1/extract", "language=" + "x" * 65, "language"),
    ],
)
@pytest.mark.parametrize("content_type", ["text/html", None])
async def test_an_invalid_option_with_an_empty_body_stays_422(
    client: httpx.AsyncClient, route: str, query: str, named: str, content_type: str | None
) -> None:
    """The option is wrong whatever the body: the 422 that names it comes first, typed or untyped."""
    headers = {} if content_type is None else {"content-type": content_type}
    response = await client.post(f"{route}?{query}", content=b"", headers=headers)
    assert named in _error(response, 422, "validation_error"), (route, query)


async def test_json_bodies_keep_their_errors(client: httpx.AsyncClient) -> None:
    """Only an empty (or blank) untyped body became a page: declared JSON, or an untyped body that is
    JSON, with a raw option is the 422 that sends the option into the body, and an empty declared-JSON
    body is invalid JSON."""
    body = json.dumps({"documents": [{"html": "<p>hi</p>"}]}).encode()
    for headers in ({}, {"content-type": "application/json"}):
        response = await client.post("/v1/embed?id=a", content=body, headers=headers)
        assert "apply to raw bodies only" in _error(response, 422, "validation_error")
    declared = {"content-type": "application/json"}
    response = await client.post("/v1/embed?id=a", content=b"", headers=declared)
    assert "apply to raw bodies only" in _error(response, 422, "validation_error")
    response = await client.post("/v1/embed", content=b"", headers=declared)
    assert _error(response, 422, "validation_error").startswith("Invalid JSON")
    response = await client.post("/v1/embed", content=b"[", headers={})  # untyped, not markup: JSON
    assert _error(response, 422, "validation_error").startswith("Invalid JSON")


async def test_an_untyped_body_of_white_space_is_the_page_it_is(client: httpx.AsyncClient) -> None:
    """No JSON is white space alone: such a body sent untyped (a crawler's fetch of a blank page) is the
    page text/html makes of it, not a 422 "Invalid JSON"."""
    for route in ("/v1/embed", "/v1/preprocess", "/v1/extract"):
        for body in (b"\n", b" \r\n\t "):
            untyped = await client.post(f"{route}?id=blank", content=body, headers={})
            html = {"content-type": "text/html"}
            typed = await client.post(f"{route}?id=blank", content=body, headers=html)
            assert (untyped.status_code, untyped.json()) == (typed.status_code, typed.json()), (route, body)
            assert untyped.status_code == 200, untyped.text


async def test_the_openapi_document_says_an_empty_body_is_400(client: httpx.AsyncClient) -> None:
    """What the server does is what generated clients are told: 400 `empty_input` on each raw-body route,
    and the request body's description names the untyped case."""
    spec = (await client.get("/openapi.json")).json()
    for route in await _raw_body_options(client):
        operation = spec["paths"][route]["post"]
        assert "empty raw body" in operation["responses"]["400"]["description"], route
        assert "`empty_input`" in operation["responses"]["400"]["description"], route
        description = operation["requestBody"]["description"]
        assert "an empty page, or an empty body without a Content-Type, is 400" in description, route
        assert operation["requestBody"]["content"]["text/html"]["schema"]["minLength"] == 1, route

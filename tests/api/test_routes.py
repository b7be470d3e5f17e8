"""Every route in-process (httpx over ASGI), with the tiny checkpoint: shapes, options, limits, errors."""

from __future__ import annotations

import asyncio
import base64
import codecs
import gc
import gzip
import json
import logging
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import brotli
import httpx
import numpy as np
import pytest
import zstandard
from prometheus_client import generate_latest

from service.api import runtime as runtime_module
from service.api.app import create_app
from service.api.routers import embed as embed_router
from service.api.routers import extract as extract_router
from service.api.schemas import ExtractionOut
from service.engine import Document, OverloadedError
from tests.api.conftest import SettingsFactory, app_client, tiny_settings
from tests.api.pages import CZECH_TEXT, WINDOWS_1250_PAGE, long_page, page, slow_to_extract_page
from tests.factories.checkpoint import (
    CLASSIFICATION_HEAD,
    REGRESSION_HEAD,
    TINY_MAX_LENGTH,
    build_tiny_checkpoint,
)

# One event loop for the module, so the shared `client` app (and its engine) lives across tests.
pytestmark = pytest.mark.asyncio(loop_scope="module")


def embedding(item: dict[str, object]) -> np.ndarray:
    return np.asarray(item["embedding"], dtype=np.float32)


async def embed_one(client: httpx.AsyncClient, html: str, **options: object) -> dict[str, object]:
    response = await client.post("/v1/embed", json={"documents": [{"html": html}], **options})
    assert response.status_code == 200, response.text
    item: dict[str, object] = response.json()["data"][0]
    return item


async def test_embed_returns_embeddings_scores_and_usage(client: httpx.AsyncClient) -> None:
    docs = [{"id": "a", "html": page(1), "url": "https://example.com/a"}, {"id": "b", "html": page(2)}]
    response = await client.post("/v1/embed", json={"documents": docs})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "tiny-test"
    assert [d["id"] for d in body["data"]] == ["a", "b"]
    info = (await client.get("/info")).json()
    for item in body["data"]:
        vector = embedding(item)
        assert vector.shape == (info["embedding_dim"],)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)
        probabilities = item["scores"][CLASSIFICATION_HEAD.name]
        assert set(probabilities) == set(CLASSIFICATION_HEAD.labels)
        assert sum(probabilities.values()) == pytest.approx(1.0, abs=1e-4)
        assert isinstance(item["scores"][REGRESSION_HEAD.name], float)
        assert 2 < item["tokens"] <= TINY_MAX_LENGTH
    assert body["usage"] == {"documents": 2, "tokens": sum(d["tokens"] for d in body["data"])}
    for header in ("x-prune-time", "x-tokenize-time", "x-queue-time", "x-inference-time", "x-total-time"):
        assert float(response.headers[header]) >= 0.0
    assert float(response.headers["x-total-time"]) >= float(response.headers["x-inference-time"])


async def test_embed_options(client: httpx.AsyncClient) -> None:
    html = page(3)
    raw = embedding(await embed_one(client, html, normalize=False))
    normalized = embedding(await embed_one(client, html))
    np.testing.assert_allclose(raw / np.linalg.norm(raw), normalized, atol=1e-5)
    assert abs(float(np.linalg.norm(raw)) - 1.0) > 1e-3

    only = await embed_one(client, html, heads=[REGRESSION_HEAD.name])
    assert set(only["scores"]) == {REGRESSION_HEAD.name}
    assert (await embed_one(client, html, heads=[]))["scores"] == {}

    encoded = await embed_one(client, html, encoding_format="base64")
    assert isinstance(encoded["embedding"], str)
    decoded = np.frombuffer(base64.b64decode(encoded["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, normalized)


async def test_unknown_head_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/embed", json={"documents": [{"html": page(1)}], "heads": ["nope"]})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "unknown_head"


async def test_raw_body_uses_the_declared_charset(client: httpx.AsyncClient) -> None:
    """A windows-1250 page as bytes with its charset gives what its decoded text gives as JSON."""
    headers = {"content-type": "text/html; charset=windows-1250"}
    pruned = await client.post("/v1/preprocess", content=WINDOWS_1250_PAGE, headers=headers)
    assert pruned.status_code == 200, pruned.text
    assert CZECH_TEXT in pruned.json()["data"][0]["html"]

    raw = await client.post("/v1/embed?id=cz&heads=quality", content=WINDOWS_1250_PAGE, headers=headers)
    assert raw.status_code == 200, raw.text
    item = raw.json()["data"][0]
    assert item["id"] == "cz" and set(item["scores"]) == {"quality"}
    as_text = await embed_one(client, WINDOWS_1250_PAGE.decode("windows-1250"), heads=["quality"])
    np.testing.assert_allclose(embedding(item), embedding(as_text), atol=1e-6)
    assert item["tokens"] == as_text["tokens"]


async def test_octet_stream_body(client: httpx.AsyncClient) -> None:
    html = page(4)
    response = await client.post(
        "/v1/embed", content=html.encode(), headers={"content-type": "application/octet-stream"}
    )
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        embedding(response.json()["data"][0]), embedding(await embed_one(client, html)), atol=1e-6
    )


@pytest.mark.parametrize(
    ("request_kwargs", "status", "code"),
    [
        ({"json": {"documents": []}}, 400, "empty_input"),
        ({"content": b"", "headers": {"content-type": "text/html"}}, 400, "empty_input"),
        ({"json": {"documents": [{"html": "x"}] * 9}}, 422, "too_many_documents"),
        ({"json": {"documents": [{"html": "x", "typo": 1}]}}, 422, "validation_error"),
        ({"json": {"documents": [{"html": 5}]}}, 422, "validation_error"),
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 422, "validation_error"),
        ({"content": b"hello", "headers": {"content-type": "text/plain"}}, 415, "unsupported_media_type"),
        ({"json": {"documents": [{"html": "x"}]}, "params": {"heads": "quality"}}, 422, "validation_error"),
    ],
)
async def test_embed_errors(
    settings_for: SettingsFactory, request_kwargs: dict[str, object], status: int, code: str
) -> None:
    async with app_client(settings_for(max_documents=8)) as client:
        response = await client.post("/v1/embed", **request_kwargs)  # type: ignore[arg-type]
        assert response.status_code == status, response.text
        assert response.json() == {"error": {"code": code, "message": response.json()["error"]["message"]}}
        assert response.json()["error"]["message"]
        metrics = (await client.get("/metrics")).text
        assert f'htmllm_request_failures_total{{code="{code}"}} 1.0' in metrics


@pytest.mark.parametrize(
    ("route", "query"),
    [
        ("/v1/embed", "normalise=false"),
        ("/v1/embed", "head=quality"),
        ("/v1/preprocess", "idd=x"),
        ("/v1/extract", "min_word=0"),
    ],
)
@pytest.mark.parametrize("content_type", ["text/html", "application/json"])
async def test_an_unknown_query_option_is_422_not_ignored(
    client: httpx.AsyncClient, route: str, query: str, content_type: str
) -> None:
    """A misspelt option answered as if absent (normalised embeddings for `normalise=false`) is a bug the
    client never sees."""
    body = page(2).encode() if content_type == "text/html" else json.dumps({"documents": [{"html": page(2)}]})
    response = await client.post(f"{route}?{query}", content=body, headers={"content-type": content_type})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"
    assert repr(query.split("=")[0]) in response.json()["error"]["message"]


async def test_an_empty_heads_query_option_asks_for_no_heads(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/embed?heads=", content=page(2).encode(), headers={"content-type": "text/html"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["data"][0]["scores"] == {}
    assert response.json()["data"][0]["embedding"]


@pytest.mark.parametrize("prefix", [b"", b"\n  ", codecs.BOM_UTF8, codecs.BOM_UTF8 + b"\r\n"])
async def test_a_page_posted_without_a_content_type_is_a_raw_page(
    client: httpx.AsyncClient, prefix: bytes
) -> None:
    """What `requests.post(url, data=page)` sends: no Content-Type. JSON cannot start with `<`."""
    html = page(4)
    response = await client.post("/v1/embed?id=p", content=prefix + html.encode())
    assert response.status_code == 200, response.text
    item = response.json()["data"][0]
    assert item["id"] == "p"
    np.testing.assert_allclose(embedding(item), embedding(await embed_one(client, html)), atol=1e-6)
    utf16 = await client.post("/v1/preprocess", content=codecs.BOM_UTF16_LE + html.encode("utf-16-le"))
    assert utf16.status_code == 200, utf16.text
    # Without a byte order mark too, as the decoder reads it (big-endian, or after a newline, the body
    # had been read as JSON: 422 "Invalid JSON").
    for codec in ("utf-16-le", "utf-16-be"):
        bare = await client.post("/v1/embed", content=("\n" + html).encode(codec))
        assert bare.status_code == 200, (codec, bare.text)
        np.testing.assert_allclose(embedding(bare.json()["data"][0]), embedding(item), atol=1e-6)
    # UTF-16 JSON is not a page, though it holds markup.
    as_json = json.dumps({"documents": [{"html": html}]}).encode("utf-16-le")
    assert (await client.post("/v1/embed", content=as_json)).status_code == 422


async def test_json_errors_say_what_the_body_was_read_as(client: httpx.AsyncClient) -> None:
    untyped = await client.post("/v1/embed", content=b"hello")
    assert untyped.status_code == 422
    assert "without Content-Type is read as JSON" in untyped.json()["error"]["message"]
    body = json.dumps({"documents": [{"html": "<p>caf\u00e9</p>"}]}, ensure_ascii=False).encode("utf-16")
    for route in ("/v1/embed", "/v1/embeddings"):
        declared = await client.post(
            route, content=body, headers={"content-type": "application/json; charset=utf-16"}
        )
        assert declared.status_code == 422
        assert "read as UTF-8; this one declares charset='utf-16'" in declared.json()["error"]["message"]
    # Sent in UTF-16 or UTF-32 with no charset (PowerShell's default): said so, not "expected value at
    # line 1 column 1" alone.
    for codec in ("utf-16", "utf-16-le", "utf-32"):
        for headers in ({}, {"content-type": "application/json"}):
            wide_body = body.decode("utf-16").encode(codec)
            wide = await client.post("/v1/embed", content=wide_body, headers=headers)
            assert wide.status_code == 422
            assert "this one is in UTF-16 or UTF-32" in wide.json()["error"]["message"], (codec, headers)
    # ASCII JSON under another label reads the same, and is taken.
    latin = await client.post(
        "/v1/embed",
        content=json.dumps({"documents": [{"html": page(2)}]}).encode(),
        headers={"content-type": "application/json; charset=iso-8859-1"},
    )
    assert latin.status_code == 200, latin.text


@pytest.mark.parametrize("header", ["text/plain", ";;;", "image/png; charset=utf-8"])
async def test_an_unsupported_content_type_is_quoted_as_sent(
    settings_for: SettingsFactory, header: str
) -> None:
    async with app_client(settings_for()) as client:
        response = await client.post("/v1/embed", content=b"<p>x</p>", headers={"content-type": header})
        assert response.status_code == 415, response.text
        message = response.json()["error"]["message"]
        assert message.startswith(f"unsupported Content-Type {header!r}"), message


async def test_truncation_policy(settings_for: SettingsFactory) -> None:
    async with app_client(settings_for(truncate=False)) as client:
        rejected = await client.post("/v1/embed", json={"documents": [{"html": long_page()}]})
        assert rejected.status_code == 422
        assert rejected.json()["error"]["code"] == "too_many_tokens"
        # The request's own option wins over the server's policy.
        cut = await embed_one(client, long_page(), truncate=True)
        assert cut["truncated"] is True and cut["tokens"] == TINY_MAX_LENGTH
        short = await embed_one(client, page(1))
        assert short["truncated"] is False


async def test_on_error_report_answers_each_document(settings_for: SettingsFactory) -> None:
    """A page over the limit fails alone: its entry carries the error, the others their results."""
    docs = [{"id": "a", "html": page(1)}, {"id": "long", "html": long_page()}, {"id": "c", "html": page(2)}]
    async with app_client(settings_for(truncate=False)) as client:
        failing = await client.post("/v1/embed", json={"documents": docs})
        assert failing.status_code == 422 and failing.json()["error"]["code"] == "too_many_tokens"

        response = await client.post("/v1/embed", json={"documents": docs, "on_error": "report"})
        assert response.status_code == 200, response.text
        body = response.json()
        first, long, last = body["data"]
        assert [first["id"], long["id"], last["id"]] == ["a", "long", "c"]
        assert long["embedding"] is None and long["tokens"] is None and long["scores"] == {}
        assert long["error"]["code"] == "too_many_tokens" and "'long'" in long["error"]["message"]
        alone = await client.post("/v1/embed", json={"documents": [docs[0], docs[2]]})
        for got, want in zip((first, last), alone.json()["data"], strict=True):
            assert got["error"] is None and got["tokens"] == want["tokens"]
            np.testing.assert_allclose(embedding(got), embedding(want), atol=1e-5)
        assert body["usage"] == {"documents": 2, "tokens": first["tokens"] + last["tokens"]}
        assert float(response.headers["x-inference-time"]) >= 0.0

        # One raw page takes the option in its query string; a JSON body must not.
        raw = await client.post(
            "/v1/embed?id=r&on_error=report",
            content=long_page().encode(),
            headers={"content-type": "text/html"},
        )
        assert raw.status_code == 200 and raw.json()["data"][0]["error"]["code"] == "too_many_tokens"
        assert raw.json()["usage"] == {"documents": 0, "tokens": 0}
        misplaced = await client.post("/v1/embed?on_error=report", json={"documents": docs})
        assert misplaced.status_code == 422
        unknown = await client.post("/v1/embed", json={"documents": docs, "on_error": "ignore"})
        assert unknown.status_code == 422

        metrics = (await client.get("/metrics")).text
        # The failing request's long page (its other two are not failures), then the report request's,
        # then the raw page.
        assert 'htmllm_documents_failed_total{code="too_many_tokens"} 3.0' in metrics


async def test_on_error_report_at_the_deadline(settings_for: SettingsFactory) -> None:
    # A lone document waits max_wait_ms for company, past the request's timeout: its entry says so.
    async with app_client(settings_for(request_timeout_s=0.5, max_wait_ms=3000)) as client:
        body = {"documents": [{"id": "late", "html": page(1)}], "on_error": "report"}
        response = await client.post("/v1/embed", json=body)
        assert response.status_code == 200, response.text
        (item,) = response.json()["data"]
        assert item["error"]["code"] == "timeout" and item["embedding"] is None
        assert re.fullmatch(
            r"the deadline passed while the document was queued \(\d+\.\d s\)", item["error"]["message"]
        )


async def test_openai_embeddings(client: httpx.AsyncClient) -> None:
    pages = [page(5), page(6)]
    response = await client.post("/v1/embeddings", json={"input": pages, "model": "anything"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == "tiny-test"
    assert [d["index"] for d in body["data"]] == [0, 1]
    native = (await client.post("/v1/embed", json={"documents": [{"html": p} for p in pages]})).json()
    for ours, theirs in zip(native["data"], body["data"], strict=True):
        np.testing.assert_allclose(embedding(ours), embedding(theirs), atol=1e-6)
    assert body["usage"]["prompt_tokens"] == native["usage"]["tokens"] == body["usage"]["total_tokens"]

    single = await client.post("/v1/embeddings", json={"input": pages[0], "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(single.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, embedding(native["data"][0]), atol=1e-6)

    wrong = await client.post("/v1/embeddings", json={"input": pages[0], "dimensions": 3})
    assert wrong.status_code == 422 and wrong.json()["error"]["code"] == "validation_error"
    tokens = await client.post("/v1/embeddings", json={"input": [[1, 2, 3]]})
    assert tokens.status_code == 422


async def test_tei_embed(client: httpx.AsyncClient) -> None:
    response = await client.post("/embed", json={"inputs": [page(7), page(8)], "normalize": False})
    assert response.status_code == 200, response.text
    vectors = np.asarray(response.json(), dtype=np.float32)
    expected = embedding(await embed_one(client, page(7), normalize=False))
    np.testing.assert_allclose(vectors[0], expected, atol=1e-6)
    single = await client.post("/embed", json={"inputs": page(7)})
    assert len(single.json()) == 1
    # TEI's prompt_name asks for another kind of embedding: refused, never ignored.
    prompted = await client.post("/embed", json={"inputs": page(7), "prompt_name": "query"})
    assert prompted.status_code == 422 and "no prompts" in prompted.json()["error"]["message"]
    assert (await client.post("/embed", json={"inputs": page(7), "prompt_name": None})).status_code == 200


async def test_preprocess(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/preprocess", json={"documents": [{"id": "p", "html": page(9)}]})
    assert response.status_code == 200, response.text
    item = response.json()["data"][0]
    assert item["id"] == "p"
    assert "<script" not in item["html"] and "class=" not in item["html"] and "<p>" in item["html"]
    assert item["tokens"] > 2


async def test_info_health_ready_metrics(client: httpx.AsyncClient) -> None:
    info = (await client.get("/info")).json()
    assert info["model"] == "tiny-test" and info["max_length"] == TINY_MAX_LENGTH
    assert {h["name"] for h in info["heads"]} == {CLASSIFICATION_HEAD.name, REGRESSION_HEAD.name}
    # Counts stay integers (a float-only schema made them 5.0 and 40.0), figures stay floats.
    (metrics,) = [h["metrics"] for h in info["heads"] if h["name"] == CLASSIFICATION_HEAD.name]
    assert json.dumps(metrics, sort_keys=True) == '{"cv_folds": 5, "f1_macro": 0.5, "pages": 40}'
    assert info["limits"]["max_documents"] == 64 and info["auth"] is False
    assert info["dtype"] == "float32" and info["threads"] >= 1 and info["attention"] == "sdpa"
    assert (info["preprocess_pool"], info["preprocess_workers"]) == ("thread", 1)
    assert info["inference_process"] is False
    assert (await client.get("/health")).json() == {"status": "ok"}
    assert (await client.get("/ready")).json() == {"status": "ready", "model": "tiny-test"}
    for probe in ("/health", "/ready", "/info", "/metrics"):  # load balancers probe with HEAD
        assert (await client.head(probe)).status_code == 200, probe
        refused = await client.post(probe)
        assert refused.status_code == 405 and set(refused.headers["allow"].split(", ")) == {"GET", "HEAD"}
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200 and "htmllm_ready 1.0" in metrics.text
    assert "htmllm_queue_size" in metrics.text


async def test_openapi_operation_ids_are_unique(client: httpx.AsyncClient) -> None:
    """Client generators need unique operationIds; one route for GET and HEAD gave both the same one."""
    spec = (await client.get("/openapi.json")).json()
    ids = [operation["operationId"] for path in spec["paths"].values() for operation in path.values()]
    assert len(ids) == len(set(ids)), sorted(ids)
    assert {"/", "/ping", "/health", "/ready", "/embed", "/invocations", "/embeddings"} <= set(spec["paths"])


async def test_start_up_state_is_frozen_once_ready_and_thawed_at_shutdown(
    settings_for: SettingsFactory,
) -> None:
    app = create_app(settings_for())
    async with app.router.lifespan_context(app):
        runtime = app.state.runtime
        for _ in range(600):
            if runtime.ready:
                break
            await asyncio.sleep(0.01)
        assert runtime.ready and runtime.collector is not None
        assert runtime.collector.frozen > 0 and gc.get_freeze_count() > 0
        gc.collect()  # a full collection, which the app times
        text = generate_latest(runtime.metrics.registry).decode()
        full = re.search(r'^htmllm_gc_pause_seconds_count\{generation="2"\} (\S+)$', text, re.MULTILINE)
        assert full is not None and float(full.group(1)) >= 1
    assert gc.get_freeze_count() == 0  # handed back: this process outlives the app


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v2/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong_method = await client.get("/v1/embed")
    assert wrong_method.status_code == 405, wrong_method.text
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert wrong_method.headers["allow"] == "POST"


async def test_a_path_with_a_trailing_slash_is_no_route(client: httpx.AsyncClient) -> None:
    """FastAPI redirected `/v1/embed/` to `/v1/embed` (307, which httpx does not follow and a client took
    for an answer without a body); it is a 404 `not_found`, as any other path no route has."""
    html = {"content-type": "text/html"}
    for method, path in (("POST", "/v1/embed/"), ("POST", "/v1/embeddings/"), ("GET", "/health/")):
        body = page(0) if method == "POST" else None
        answer = await client.request(method, path, content=body, headers=html)
        assert answer.status_code == 404, (path, answer.status_code, answer.headers)
        assert answer.json()["error"]["code"] == "not_found" and "location" not in answer.headers


async def test_request_metrics_keep_their_label_sets_bounded(client: httpx.AsyncClient) -> None:
    """Scanners try paths and methods by the thousand; the labels stay the routes and HTTP's methods."""
    for i in range(20):
        await client.get(f"/scan/{i}")
        await client.request(f"PROBE{i}", "/health")
    text = (await client.get("/metrics")).text
    assert "/scan/" not in text and "PROBE" not in text
    assert 'route="<unmatched>",status="404"' in text
    assert 'method="<other>",route="/health"' in text


async def test_body_limit_before_parsing(settings_for: SettingsFactory) -> None:
    async with app_client(settings_for(max_body_bytes=1000)) as client:
        declared = await client.post("/v1/embed", content=b"x" * 1001, headers={"content-type": "text/html"})
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "payload_too_large"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b"y" * 100

        chunked = await client.post("/v1/embed", content=chunks(), headers={"content-type": "text/html"})
        assert chunked.status_code == 413
        fits = await client.post("/v1/embed", json={"documents": [{"html": "<p>short</p>"}]})
        assert fits.status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'htmllm_requests_total{method="POST",route="/v1/embed",status="413"} 2.0' in metrics


async def test_compressed_request_bodies(settings_for: SettingsFactory) -> None:
    """Every content coding gives what the plain body gives; the body cap holds for decoded bytes."""
    body = json.dumps({"documents": [{"html": page(7)}, {"html": long_page(3)}]}).encode()
    encoders = {"gzip": gzip.compress, "br": brotli.compress, "zstd": zstandard.ZstdCompressor().compress}
    async with app_client(settings_for(max_body_bytes=len(body) + 100)) as client:
        plain = await client.post("/v1/embed", content=body, headers={"content-type": "application/json"})
        assert plain.status_code == 200, plain.text
        for coding, encode in encoders.items():
            response = await client.post(
                "/v1/embed",
                content=encode(body),
                headers={"content-type": "application/json", "content-encoding": coding},
            )
            assert response.status_code == 200, (coding, response.text)
            for got, want in zip(response.json()["data"], plain.json()["data"], strict=True):
                np.testing.assert_allclose(embedding(got), embedding(want), atol=1e-6)
        # A raw page: the charset still comes from Content-Type, the bytes from the gzip stream.
        raw = await client.post(
            "/v1/preprocess",
            content=gzip.compress(WINDOWS_1250_PAGE),
            headers={"content-type": "text/html; charset=windows-1250", "content-encoding": "gzip"},
        )
        assert raw.status_code == 200 and CZECH_TEXT in raw.json()["data"][0]["html"]

        bomb = gzip.compress(b" " * (len(body) + 101))
        too_big = await client.post("/v1/embed", content=bomb, headers={"content-encoding": "gzip"})
        assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "payload_too_large"
        assert "HTMLLM_MAX_BODY_BYTES" in too_big.json()["error"]["message"]
        corrupt = await client.post(
            "/v1/embed", content=gzip.compress(body)[:-20], headers={"content-encoding": "gzip"}
        )
        assert corrupt.status_code == 422 and corrupt.json()["error"]["code"] == "validation_error"
        assert "gzip body is corrupt" in corrupt.json()["error"]["message"]
        unknown = await client.post("/v1/embed", content=body, headers={"content-encoding": "compress"})
        assert unknown.status_code == 415 and unknown.json()["error"]["code"] == "unsupported_media_type"
        metrics = (await client.get("/metrics")).text
        assert 'htmllm_request_failures_total{code="payload_too_large"} 1.0' in metrics
        assert (await client.post("/v1/embed", content=body)).status_code == 200


def _vector(route: str, answer: object) -> np.ndarray:
    """The one embedding of a compatible route's answer (OpenAI's object or TEI's list of lists)."""
    if route == "/embed":
        assert isinstance(answer, list)
        return np.asarray(answer[0], dtype=np.float32)
    assert isinstance(answer, dict)
    return np.asarray(answer["data"][0]["embedding"], dtype=np.float32)


async def test_compatible_routes_take_json_with_or_without_a_content_type(client: httpx.AsyncClient) -> None:
    """As /v1/embed does: no Content-Type reads as JSON; a form type (curl -d) is a clear 415."""
    for route, body in (("/v1/embeddings", {"input": page(1)}), ("/embed", {"inputs": page(1)})):
        payload = json.dumps(body).encode()
        typed = await client.post(route, content=payload, headers={"content-type": "application/json"})
        untyped = await client.post(route, content=payload)
        assert typed.status_code == untyped.status_code == 200, (route, untyped.text)
        zipped = await client.post(
            route, content=gzip.compress(payload), headers={"content-encoding": "gzip"}
        )
        assert zipped.status_code == 200
        vectors = [_vector(route, r.json()) for r in (typed, untyped, zipped)]
        for vector in vectors[1:]:
            np.testing.assert_allclose(vector, vectors[0], atol=1e-5)
        form = await client.post(
            route, content=payload, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
        assert "send application/json" in form.json()["error"]["message"]
        broken = await client.post(route, content=b"{not json")
        assert broken.status_code == 422 and broken.json()["error"]["code"] == "validation_error"
        # A page posted as the body (`requests.post(url, data=page)`) says where a page goes (it was
        # "Invalid JSON: expected value at line 1 column 1").
        for raw in (page(1).encode(), page(1).encode("utf-16-be")):
            misplaced = await client.post(route, content=raw)
            assert misplaced.status_code == 415, (route, misplaced.text)
            assert "post it raw to /v1/embed" in misplaced.json()["error"]["message"]
    # A body-less GET that claims a coding has nothing to decode.
    assert (await client.get("/health", headers={"content-encoding": "lzma"})).status_code == 200
    schema = (await client.get("/openapi.json")).json()
    for route, model in (("/v1/embeddings", "OpenAIEmbeddingsRequest"), ("/embed", "TeiEmbedRequest")):
        content = schema["paths"][route]["post"]["requestBody"]["content"]
        assert content["application/json"]["schema"]["$ref"] == f"#/components/schemas/{model}"
        assert model in schema["components"]["schemas"]


async def test_json_with_a_byte_order_mark_or_lone_surrogate_escapes(client: httpx.AsyncClient) -> None:
    """What clients send and strict parsers refuse: a UTF-8 BOM before the JSON, and the "\\udcff"
    escapes Python's json.dumps writes for text decoded with surrogateescape. The surrogates read as
    U+FFFD, as undecodable bytes of a raw page do; a broken body is still a 422."""
    html = page(2) + "<p>caf\udce9</p>"
    sent = json.dumps({"documents": [{"id": "x\udcff", "html": html}]}).encode()  # ensure_ascii: escapes
    assert b"\\udce9" in sent
    for body in (sent, codecs.BOM_UTF8 + sent):
        response = await client.post("/v1/embed", content=body)
        assert response.status_code == 200, response.text
        result = response.json()["data"][0]
        assert result["id"] == "x\ufffd"
        want = await embed_one(client, page(2) + "<p>caf\ufffd</p>")
        np.testing.assert_allclose(embedding(result), embedding(want), atol=1e-5)
    for broken in (b'{"documents": [{"html": "\\ud800"}', codecs.BOM_UTF8 + b"{not json"):
        refused = await client.post("/v1/embed", content=broken)
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "validation_error"


async def test_no_json_body_is_a_500_or_parsed_past_a_bound(client: httpx.AsyncClient) -> None:
    """Arrays nested 1,000 deep after a lone surrogate escape were a 500 (the repair's parser recursed);
    a field of 5.6 million empty arrays that no route reads was parsed in full (5.1 s of CPU, 750 MB).
    Both are a 422 on every JSON route now, the second before pydantic parses anything."""
    deep = b"[" * 1000 + b"]" * 1000
    junk = b"[" + b"[]," * 20_000 + b"[]]"
    for route, head in (
        ("/v1/embed", b'{"documents": [{"html": "\\ud800"}], "x": '),
        ("/v1/preprocess", b'{"documents": [{"html": "\\ud800"}], "x": '),
        ("/v1/extract", b'{"documents": [{"html": "\\ud800"}], "x": '),
        ("/v1/embeddings", b'{"input": "\\ud800", "x": '),
        ("/embed", b'{"inputs": "\\ud800", "x": '),
    ):
        for tail, says in ((deep, "recursion limit exceeded"), (junk, "list items and objects")):
            response = await client.post(route, content=head + tail + b"}")
            assert response.status_code == 422, (route, response.text[:300])
            error = response.json()["error"]
            assert error["code"] == "validation_error" and says in error["message"], (route, error)


async def test_result_cache_over_http(settings_for: SettingsFactory) -> None:
    body = {"documents": [{"html": page(3)}]}
    async with app_client(settings_for(result_cache_documents=16)) as client:
        first = await client.post("/v1/embed", json=body)
        second = await client.post("/v1/embed", json=body)
        assert first.status_code == second.status_code == 200
        assert first.json()["data"] == second.json()["data"]
        assert second.headers["x-inference-time"] == "0.000"  # answered without the model
        assert "htmllm_result_cache_hits_total 1.0" in (await client.get("/metrics")).text


async def test_request_ids(client: httpx.AsyncClient) -> None:
    """Every response names its request: the client's id when it is usable, a fresh uuid4 otherwise."""
    made = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
    assert re.fullmatch(r"[0-9a-f]{32}", made.headers["x-request-id"])
    again = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
    assert again.headers["x-request-id"] != made.headers["x-request-id"]
    kept = await client.get("/health", headers={"x-request-id": "crawler-7:batch/42"})
    assert kept.headers["x-request-id"] == "crawler-7:batch/42"
    for unusable in ("has space", "x" * 129, "semi;colon", ""):
        replaced = await client.get("/health", headers={"x-request-id": unusable})
        assert re.fullmatch(r"[0-9a-f]{32}", replaced.headers["x-request-id"]), unusable
    # Errors too, including those answered before routing.
    missing = await client.get("/nowhere", headers={"x-request-id": "r-404"})
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "r-404"
    unknown = await client.post(
        "/v1/embed", content=b"{}", headers={"content-encoding": "lzma", "x-request-id": "r-415"}
    )
    assert unknown.status_code == 415 and unknown.headers["x-request-id"] == "r-415"
    assert len(missing.headers.get_list("x-request-id")) == 1


async def test_a_bug_is_a_500_with_the_request_id_logged(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An untyped exception's 500 leaves from outside the middleware stack: it still names the request."""
    app = create_app(settings_for())

    def broken(documents: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(embed_router, "to_documents", broken)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            with caplog.at_level(logging.ERROR, logger="service.api.errors"):
                failed = await client.post(
                    "/v1/embed", json={"documents": [{"html": page(1)}]}, headers={"x-request-id": "bug-1"}
                )
            assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal_error"
            assert failed.headers["x-request-id"] == "bug-1"
            assert any("(request bug-1)" in record.getMessage() for record in caplog.records)
            assert (await client.get("/health")).status_code == 200  # and it keeps serving


async def test_responses_are_gzipped_for_clients_that_accept_it(settings_for: SettingsFactory) -> None:
    body = {"documents": [{"html": page(i)} for i in range(4)]}
    async with app_client(settings_for()) as client:
        plain = await client.post("/v1/embed", json=body, headers={"accept-encoding": "identity"})
        assert plain.status_code == 200 and "content-encoding" not in plain.headers
        zipped = await client.post("/v1/embed", json=body, headers={"accept-encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip" and zipped.headers["vary"] == "Accept-Encoding"
        # httpx undoes the coding; the answers agree to what batching allows.
        assert zipped.json()["usage"] == plain.json()["usage"]
        for got, want in zip(zipped.json()["data"], plain.json()["data"], strict=True):
            np.testing.assert_allclose(embedding(got), embedding(want), atol=1e-5)
        assert int(zipped.headers["content-length"]) < len(plain.content) // 2
        small = await client.get("/health", headers={"accept-encoding": "gzip"})
        assert "content-encoding" not in small.headers  # under gzip_min_bytes: not worth it
        for refused in ("gzip;q=0", "br, gzip;q=0, deflate"):  # RFC 9110: q=0 is "not acceptable"
            response = await client.post("/v1/embed", json=body, headers={"accept-encoding": refused})
            assert response.status_code == 200 and "content-encoding" not in response.headers, refused
            assert response.json()["usage"] == plain.json()["usage"]
    async with app_client(settings_for(gzip_min_bytes=0)) as client:
        never = await client.post("/v1/embed", json=body, headers={"accept-encoding": "gzip"})
        assert never.status_code == 200 and "content-encoding" not in never.headers


async def test_api_key(settings_for: SettingsFactory) -> None:
    async with app_client(settings_for(api_key="s3cret")) as client:
        body = {"documents": [{"html": page(1)}]}
        missing = await client.post("/v1/embed", json=body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["code"] == "unauthorized"
        wrong = await client.post("/v1/embed", json=body, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = await client.post("/v1/embed", json=body, headers={"authorization": "Bearer s3cret"})
        assert right.status_code == 200
        for route in ("/v1/embeddings", "/embed", "/v1/preprocess", "/v1/extract"):
            assert (await client.post(route, json={})).status_code == 401, route
        for route in ("/health", "/ready", "/metrics", "/info", "/openapi.json"):
            assert (await client.get(route)).status_code == 200, route
        # Refused before its body is read: a client without a key learns nothing of the body limits
        # (413, 415) and cannot make the server decode or hold its bodies.
        for headers in ({"content-encoding": "snappy"}, {"content-length": str(1 << 40)}):
            refused = await client.post("/v1/embed", content=b"x", headers=headers)
            assert refused.status_code == 401, (headers, refused.text)
        held = await client.post("/v1/embed", content=b"x", headers={"content-encoding": "snappy"})
        assert (
            held.status_code == 401
            and "\nhtmllm_request_body_bytes_in_flight 0.0" in (await client.get("/metrics")).text
        )
        # A wrong method is the key's business first: no route name is confirmed without one.
        assert (await client.get("/v1/embed")).status_code == 401
        assert (await client.get("/v1/embed", headers={"authorization": "Bearer s3cret"})).status_code == 405
        keyed = {"authorization": "Bearer s3cret", "content-encoding": "snappy"}
        assert (await client.post("/v1/embed", content=b"x", headers=keyed)).status_code == 415


async def test_timeout_is_504(settings_for: SettingsFactory) -> None:
    # A lone document waits max_wait_ms for company, far past the request's timeout.
    async with app_client(settings_for(request_timeout_s=0.05, max_wait_ms=500)) as client:
        response = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert response.status_code == 504
        error = response.json()["error"]
        assert error["code"] == "timeout"
        # The engine's deadline answers, saying where the documents were (the HTTP timer is a backstop).
        assert error["message"].startswith("the deadline passed "), error


async def test_large_json_body(client: httpx.AsyncClient) -> None:
    """A body big enough to be parsed off the event loop still answers like a small one."""
    html = long_page(words=20000)
    assert len(html) > 256 * 1024
    item = await embed_one(client, html, truncate=True)
    assert item["truncated"] is True and item["tokens"] == TINY_MAX_LENGTH


async def test_extract_backlog_is_bounded(settings_for: SettingsFactory) -> None:
    async with app_client(settings_for(max_queue_documents=1)) as client:
        body = {"documents": [{"html": page(1)}, {"html": page(2)}]}
        response = await client.post("/v1/extract", json=body)  # can never fit: not a 429 to retry
        assert response.status_code == 422 and "retry-after" not in response.headers
        assert response.json()["error"]["code"] == "too_many_documents"
        empty = await client.post("/v1/extract", json={"documents": []})
        assert empty.status_code == 400


async def test_more_documents_than_the_queue_holds_are_a_422_on_preprocess_as_on_embed(
    settings_for: SettingsFactory,
) -> None:
    """HTMLLM_MAX_DOCUMENTS above HTMLLM_MAX_QUEUE_DOCUMENTS: /v1/preprocess, whose documents the engine
    admits one by one, answered 429 `the queue is full (8 of 8 documents)` for ever, while /v1/embed
    answered the 422."""
    async with app_client(settings_for(max_documents=16, max_queue_documents=8)) as client:
        body = {"documents": [{"html": page(i)} for i in range(9)]}
        for route in ("/v1/embed", "/v1/preprocess"):
            response = await client.post(route, json=body)
            assert response.status_code == 422 and "retry-after" not in response.headers, response.text
            assert response.json()["error"] == {
                "code": "too_many_documents",
                "message": "9 documents in one call exceed the queue's 8",
            }
        fits = {"documents": body["documents"][:8]}
        assert (await client.post("/v1/preprocess", json=fits)).status_code == 200
        # /info says what a request may carry, for batchers that size their requests by it (TEI's name).
        info = (await client.get("/info")).json()
        assert info["max_client_batch_size"] == info["limits"]["max_documents"] == 8


async def test_a_preprocess_request_refused_partway_gives_back_its_queue_slots(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One document refused (a 429, a failed page) answers the request; its other documents, each holding
    a slot of the engine's queue, ran on for no one under a bare `gather`, filling the queue."""
    app = create_app(settings_for())
    held_slot_cancelled = asyncio.Event()

    async def preprocess(doc: Document) -> object:
        if doc.id == "refused":
            raise OverloadedError("the queue is full (1 of 1 documents)")
        try:
            await asyncio.Event().wait()  # holds its slot until cancelled
        except asyncio.CancelledError:
            held_slot_cancelled.set()
            raise
        return None

    async with app.router.lifespan_context(app):
        monkeypatch.setattr(app.state.runtime.engine, "preprocess", preprocess)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            documents = [{"id": "held", "html": page(1)}, {"id": "refused", "html": page(2)}]
            response = await client.post("/v1/preprocess", json={"documents": documents})
        assert response.status_code == 429 and response.json()["error"]["code"] == "overloaded"
        for _ in range(100):  # the cancellation lands on the held document's next turn of the loop
            if held_slot_cancelled.is_set():
                break
            await asyncio.sleep(0)
        assert held_slot_cancelled.is_set()


async def test_extract_raw_body_query_options_are_the_json_options(settings_for: SettingsFactory) -> None:
    """`?min_words=0` was read as 50 (`min_words or 50`), and five `extractors` in the query were a 500
    (a pydantic error outside the request parser); a repeated extractor ran twice."""
    raw = {"content-type": "text/html; charset=utf-8"}
    short = "<html><body><p>five words and no more</p></body></html>"
    async with app_client(settings_for()) as client:
        response = await client.post(
            "/v1/extract?min_words=0&extractors=resiliparse", content=short, headers=raw
        )
        assert response.status_code == 200, response.text
        (entry,) = response.json()["data"][0]["extractions"]
        assert entry["words"] == 5 and entry["passed"] is True
        as_json = await client.post("/v1/extract", json={"documents": [{"html": short}], "min_words": 0})
        assert as_json.json()["data"][0]["extractions"][0]["passed"] is True

        five = "&".join(["extractors=union"] * 5)
        response = await client.post(f"/v1/extract?{five}", content=short, headers=raw)
        assert response.status_code == 422 and "extractors" in response.json()["error"]["message"]
        for request in (
            client.post("/v1/extract?extractors=union&extractors=union", content=short, headers=raw),
            client.post("/v1/extract", json={"documents": [{"html": short}], "extractors": ["justext"] * 2}),
        ):
            response = await request
            assert response.status_code == 422, response.text
            assert "repeats" in response.json()["error"]["message"]


async def test_extract_says_why_an_output_failed_the_filter(settings_for: SettingsFactory) -> None:
    """The core records why an output failed the filter (`Attempt.reason`); the API dropped it, so a
    client saw `passed: false` and could not tell a short page from binary or mis-decoded text."""
    short = "<html><body><p>five words and no more</p></body></html>"
    unreadable = "<html><body><p>" + "caf\ufffd " * 40 + "</p></body></html>"
    async with app_client(settings_for()) as client:

        async def entry(html: str, extractor: str, min_words: int) -> dict[str, object]:
            body = {"documents": [{"html": html}], "extractors": [extractor], "min_words": min_words}
            response = await client.post("/v1/extract", json=body)
            assert response.status_code == 200, response.text
            (out,) = response.json()["data"][0]["extractions"]
            assert isinstance(out, dict)
            return out

        few = await entry(short, "resiliparse", 50)
        assert few["passed"] is False and few["reason"] == "5 words, fewer than the 50 needed"
        union = await entry(short, "union", 50)  # no output passed: the longest one's reason
        assert union["passed"] is False and "fewer than the 50 needed" in str(union["reason"])
        soup = await entry(unreadable, "resiliparse", 0)
        assert soup["passed"] is False and "U+FFFD, control or invisible format characters" in str(
            soup["reason"]
        )
        fine = await entry(short, "resiliparse", 0)
        assert fine["passed"] is True and fine["reason"] is None


async def test_extractor_time_limit_is_a_setting(settings_for: SettingsFactory) -> None:
    async with app_client(settings_for(extract_timeout_s=0.3)) as client:
        assert (await client.get("/info")).json()["limits"]["extract_timeout_s"] == 0.3
        warm = await client.post("/v1/extract", json={"documents": [{"html": page(1)}]})
        assert warm.status_code == 200  # the extractor process is up
        body = {"documents": [{"html": slow_to_extract_page()}, {"html": page(2)}], "extractors": ["justext"]}
        response = await client.post("/v1/extract", json=body)
        assert response.status_code == 200, response.text
        slow, fine = (item["extractions"][0] for item in response.json()["data"])
        assert slow["error"]["code"] == "extraction_failed"
        # The setting's limit, not the default 5 s (a wall-clock bound here failed on a loaded machine).
        assert "ran past its 0.3 s limit" in slow["error"]["message"], slow
        assert fine["error"] is None and fine["chosen"] == "justext"


async def test_extract_answers_what_finished_by_the_request_timeout(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch with one page still extracting at the request timeout was a 504 as a whole, and the pages
    done by then lost their text; now they keep it, and each late extraction is a `timeout` entry (as
    `/v1/embed` answers with `on_error: report`). A late job still queued is cancelled, never run."""
    release = threading.Event()
    ran: list[str | None] = []

    def extract_one(doc: Document, extractor: str, **_: object) -> ExtractionOut:
        ran.append(doc.id)
        if doc.id == "slow":
            release.wait(30)  # until the answer is in: far past the request timeout
        return ExtractionOut(
            extractor=extractor,
            chosen=extractor,
            text=doc.id,
            words=1,
            passed=True,
            language=None,
            encoding=None,
        )

    monkeypatch.setattr(extract_router, "_extract_one", extract_one)
    # One extraction thread: "fine" runs, "slow" holds the thread past the deadline, "queued" waits behind it.
    async with app_client(settings_for(request_timeout_s=0.5, extract_workers=1)) as client:
        docs = [{"id": name, "html": page(n)} for n, name in enumerate(("fine", "slow", "queued"))]
        try:
            response = await client.post(
                "/v1/extract", json={"documents": docs, "extractors": ["resiliparse"]}
            )
        finally:
            release.set()
        assert response.status_code == 200, response.text
        assert [item["id"] for item in response.json()["data"]] == ["fine", "slow", "queued"]
        fine, slow, queued = (item["extractions"][0] for item in response.json()["data"])
        assert fine == {
            "extractor": "resiliparse", "chosen": "resiliparse", "text": "fine", "words": 1, "passed": True,
            "language": None, "encoding": None, "reason": None, "error": None,
        }  # fmt: skip
        for entry, where in ((slow, "running"), (queued, "queued")):
            assert (entry["extractor"], entry["text"], entry["passed"]) == ("resiliparse", None, False)
            assert entry["error"] == {
                "code": "timeout",
                "message": f"the request timeout (0.5 s) passed while this extraction was {where}",
            }
        # The one thread takes jobs in order: had "queued" not been cancelled, it would run before "after".
        after = {"documents": [{"id": "after", "html": page(3)}], "extractors": ["resiliparse"]}
        assert (await client.post("/v1/extract", json=after)).status_code == 200
        assert ran == ["fine", "slow", "after"]


async def test_info_reports_the_extractor_limit_in_force(settings_for: SettingsFactory) -> None:
    """/v1/extract holds each extractor to the request timeout when that is shorter; /info showed the
    configured 100 s, while its preprocess_timeout_s already showed the limit in force."""
    async with app_client(settings_for(extract_timeout_s=100, request_timeout_s=30)) as client:
        limits = (await client.get("/info")).json()["limits"]
    assert (limits["extract_timeout_s"], limits["request_timeout_s"]) == (30, 30)


async def test_a_failing_backend_turns_ready_then_health_503_and_a_probe_brings_it_back(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA fault fails every later pass of that process: the pod leaves the load balancer (/ready),
    is restarted by its liveness probe if nothing heals it (/health), and comes back on its own when a
    probe pass succeeds (a child process restarted, a transient fault gone)."""
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    app = create_app(settings_for(unready_after_failures=2, unhealthy_after_s=0.5))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            for _ in range(600):
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            runner = app.state.runtime.engine._runner
            working = runner.run

            def broken(prepared: object) -> object:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")

            monkeypatch.setattr(runner, "run", broken)
            body = {"documents": [{"html": page(1)}]}
            for failures in (1, 2):
                failed = await client.post("/v1/embed", json=body)
                assert failed.status_code == 500 and failed.json()["error"]["code"] == "backend_failed"
                ready = await client.get("/ready")
                if failures == 1:  # one failure is not yet a failing backend
                    assert ready.status_code == 200
            assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
            assert "illegal memory access" in ready.json()["error"]["message"]
            assert (await client.get("/health")).status_code == 200  # not for long enough yet
            metrics = (await client.get("/metrics")).text
            assert re.search(r"^htmllm_backend_consecutive_failures [2-9]", metrics, re.MULTILINE)
            await asyncio.sleep(0.6)
            unhealthy = await client.get("/health")
            assert unhealthy.status_code == 503 and unhealthy.json()["error"]["code"] == "unhealthy"

            monkeypatch.setattr(runner, "run", working)  # the fault is gone: a probe finds out
            for _ in range(500):
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            assert (await client.get("/ready")).status_code == 200
            assert (await client.get("/health")).status_code == 200
            assert (await client.post("/v1/embed", json=body)).status_code == 200


@pytest.mark.slow
async def test_onnx_backend_serves_the_same_embeddings(client: httpx.AsyncClient, tmp_path: Path) -> None:
    """HTMLLM_BACKEND=onnx (the graph exported at start-up) answers like the torch backend."""
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")  # its own copy: the export writes model.onnx
    html = page(11)
    expected = await embed_one(client, html)
    async with app_client(tiny_settings(checkpoint, backend="onnx")) as onnx_client:
        assert (await onnx_client.get("/info")).json()["backend"] == "onnx"
        got = await embed_one(onnx_client, html)
    np.testing.assert_allclose(embedding(got), embedding(expected), atol=1e-4)
    assert got["tokens"] == expected["tokens"]
    assert got["scores"]["quality"] == pytest.approx(expected["scores"]["quality"], abs=1e-4)


async def test_a_page_past_the_preprocessing_time_limit_is_a_422_and_the_server_serves_on(
    settings_for: SettingsFactory,
) -> None:
    slow = "<html><body>" + ("<p>" + "lorem ipsum dolor " * 40 + "</p>\n") * 20_000 + "</body></html>"
    settings = settings_for(preprocess_pool="process", preprocess_timeout_s=0.1)
    async with app_client(settings) as processes:
        response = await processes.post(
            "/v1/embed", content=slow.encode(), headers={"content-type": "text/html"}
        )
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "preprocess_failed" and "took more than 0.1 s" in error["message"]
        assert (await processes.post("/v1/embed", json={"documents": [{"html": page(1)}]})).status_code == 200


async def test_preprocessing_processes_serve_the_same_answers(
    client: httpx.AsyncClient, settings_for: SettingsFactory
) -> None:
    """HTMLLM_PREPROCESS_POOL=process: a windows-1250 raw page, JSON pages and /v1/preprocess as before."""
    headers = {"content-type": "text/html; charset=windows-1250"}
    body = {"documents": [{"id": "a", "html": page(12)}, {"id": "b", "html": page(13)}]}
    expected_raw = (await client.post("/v1/embed", content=WINDOWS_1250_PAGE, headers=headers)).json()
    expected = (await client.post("/v1/embed", json=body)).json()
    pruned = (await client.post("/v1/preprocess", json=body)).json()
    limits = (await client.get("/info")).json()["limits"]
    assert (limits["preprocess_timeout_s"], limits["preprocess_memory_limit_mb"]) == (None, None)  # threads
    async with app_client(settings_for(preprocess_pool="process", preprocess_workers=2)) as processes:
        info = (await processes.get("/info")).json()
        assert (info["preprocess_pool"], info["preprocess_workers"]) == ("process", 2)
        assert (info["limits"]["preprocess_timeout_s"], info["limits"]["preprocess_memory_limit_mb"]) == (
            20,
            1024,
        )
        got_raw = (await processes.post("/v1/embed", content=WINDOWS_1250_PAGE, headers=headers)).json()
        got = (await processes.post("/v1/embed", json=body)).json()
        assert (await processes.post("/v1/preprocess", json=body)).json() == pruned
    for a, b in zip(
        [*got_raw["data"], *got["data"]], [*expected_raw["data"], *expected["data"]], strict=True
    ):
        np.testing.assert_allclose(embedding(a), embedding(b), atol=1e-6)
        assert a["tokens"] == b["tokens"]

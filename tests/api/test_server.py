"""A real uvicorn server on 127.0.0.1 with the tiny checkpoint: every route, limits, errors, load."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import huggingface_hub
import numpy as np
import openai
import pytest

from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import CZECH_TEXT, WINDOWS_1250_PAGE, page

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint, max_documents=16, max_body_bytes=64 * 1024)) as live:
        yield live


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from the exposition text (0 when the series does not exist yet)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return 0.0


def test_every_route(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/ready").json()["status"] == "ready"
        for probe in ("/health", "/ready"):
            # HEAD: no body on the wire (h11 would read one as the next answer) and the connection
            # serves the next request.
            head = client.head(probe)
            assert head.status_code == 200 and head.content == b"", probe
            assert client.get(probe).status_code == 200
        info = client.get("/info").json()
        assert info["model"] == "tiny-test" and info["limits"]["max_documents"] == 16
        assert "htmllm_queue_size" in client.get("/metrics").text
        assert client.get("/docs").status_code == 200
        paths = set(client.get("/openapi.json").json()["paths"])
        assert {"/v1/embed", "/v1/embeddings", "/embed", "/v1/preprocess", "/v1/extract", "/info"} <= paths

        docs = [{"id": str(i), "html": page(i)} for i in range(3)]
        embedded = client.post("/v1/embed", json={"documents": docs})
        assert embedded.status_code == 200, embedded.text
        assert [d["id"] for d in embedded.json()["data"]] == ["0", "1", "2"]
        assert {"x-prune-time", "x-queue-time", "x-inference-time", "x-total-time"} <= set(embedded.headers)

        openai = client.post("/v1/embeddings", json={"input": [page(0)]})
        assert openai.status_code == 200
        np.testing.assert_allclose(
            openai.json()["data"][0]["embedding"], embedded.json()["data"][0]["embedding"], atol=1e-6
        )
        tei = client.post("/embed", json={"inputs": page(1)})
        assert tei.status_code == 200
        np.testing.assert_allclose(tei.json()[0], embedded.json()["data"][1]["embedding"], atol=1e-6)

        pruned = client.post("/v1/preprocess", json={"documents": docs[:1]})
        assert pruned.status_code == 200 and "<script" not in pruned.json()["data"][0]["html"]

        text = " ".join(["Praha je hlavní město České republiky a leží na řece Vltavě."] * 12)
        html = f"<html><body><nav>Home | About</nav><article><p>{text}</p></article></body></html>"
        extracted = client.post(
            "/v1/extract",
            json={"documents": [{"id": "x", "html": html}], "extractors": ["union", "resiliparse"]},
        )
        assert extracted.status_code == 200, extracted.text
        entries = extracted.json()["data"][0]["extractions"]
        assert [e["extractor"] for e in entries] == ["union", "resiliparse"]
        for entry in entries:
            assert entry["error"] is None and "Vltavě" in entry["text"] and entry["words"] >= 50


def test_every_get_route_answers_head_as_get_without_a_body(server: LiveServer) -> None:
    """Load balancers and uptime checkers probe with HEAD: every GET route (the documented ones and the
    documentation pages) answers it with GET's status and headers and no body, and the connection
    serves the next request; a method no route at the path takes stays a typed 405 naming HEAD too."""
    with httpx.Client(base_url=server.url, timeout=60) as client:
        spec = client.get("/openapi.json").json()
        documented = {path for path, item in spec["paths"].items() if "get" in item}
        assert {"/health", "/ready", "/", "/ping", "/info", "/metrics"} <= documented
        pages = {"/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"}
        served = {"{model_id}": client.get("/info").json()["model_id"]}  # the model lookup's one answer
        for template in sorted(documented | pages):
            path = template.replace("{model_id}", served["{model_id}"])
            got = client.get(path)
            head = client.head(path, headers={"x-request-id": "probe-1"})
            assert head.status_code == got.status_code == 200, (path, head.status_code, head.text)
            assert head.content == b"", path
            for name in ("content-type", "content-encoding"):
                assert head.headers.get(name) == got.headers.get(name), (path, name)
            assert head.headers["x-request-id"] == "probe-1" and "x-total-time" in head.headers, path
        for method, path, allowed in (
            ("PUT", "/info", {"GET", "HEAD"}),
            ("DELETE", "/metrics", {"GET", "HEAD"}),
            ("POST", "/openapi.json", {"GET", "HEAD"}),
            ("PATCH", "/", {"GET", "HEAD", "POST"}),
            ("HEAD", "/v1/embed", {"POST"}),
        ):
            refused = client.request(method, path)
            assert refused.status_code == 405, (method, path)
            assert set(refused.headers["allow"].split(", ")) == allowed, (method, path)
            assert refused.headers["content-type"] == "application/json", (method, path)
            if method != "HEAD":
                assert refused.json()["error"]["code"] == "method_not_allowed", (method, path)
            else:
                assert refused.content == b"", path
        assert client.get("/health").status_code == 200  # the connection still serves


def test_existing_clients_work_unchanged(server: LiveServer) -> None:
    """The real OpenAI and Hugging Face clients, pointed at the server, get the /v1/embed embeddings."""
    pages = [page(i) for i in range(3)]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        embedded = client.post("/v1/embed", json={"documents": [{"html": html} for html in pages]})
    expected = np.asarray([item["embedding"] for item in embedded.json()["data"]], dtype=np.float32)

    # openai-python asks for base64 unless told otherwise, and decodes it itself.
    for base_url in (f"{server.url}/v1", server.url):  # TEI serves /embeddings too
        openai_client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        for encoding in (openai.NOT_GIVEN, "float"):
            answer = openai_client.embeddings.create(model="any", input=pages, encoding_format=encoding)
            got = np.asarray([item.embedding for item in answer.data], dtype=np.float32)
            np.testing.assert_allclose(got, expected, atol=1e-5)
            assert answer.usage.prompt_tokens == embedded.json()["usage"]["tokens"]
    with pytest.raises(openai.BadRequestError, match="no documents"):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0).embeddings.create(
            model="any", input=[]
        )

    # huggingface_hub's InferenceClient on a URL posts feature_extraction to `/`, as TEI serves it.
    hf_client = huggingface_hub.InferenceClient(model=server.url)
    single = hf_client.feature_extraction(pages[1], normalize=True, truncate=True)
    np.testing.assert_allclose(np.asarray(single).reshape(-1), expected[1], atol=1e-5)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        sagemaker = client.post("/invocations", json={"inputs": pages})
        np.testing.assert_allclose(np.asarray(sagemaker.json()), expected, atol=1e-5)
        for probe in ("/", "/ping"):  # TEI's liveness addresses
            assert client.get(probe).json() == {"status": "ok"}


def test_raw_windows_1250_page(server: LiveServer) -> None:
    headers = {"content-type": "text/html; charset=windows-1250"}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        pruned = client.post("/v1/preprocess", content=WINDOWS_1250_PAGE, headers=headers)
        assert pruned.status_code == 200, pruned.text
        assert CZECH_TEXT in pruned.json()["data"][0]["html"]
        raw = client.post("/v1/embed?id=cz", content=WINDOWS_1250_PAGE, headers=headers)
        assert raw.status_code == 200, raw.text
        text = WINDOWS_1250_PAGE.decode("windows-1250")
        as_json = client.post("/v1/embed", json={"documents": [{"html": text}]})
        np.testing.assert_allclose(
            raw.json()["data"][0]["embedding"], as_json.json()["data"][0]["embedding"], atol=1e-6
        )
        gzipped = client.post(
            "/v1/embed?id=cz",
            content=gzip.compress(WINDOWS_1250_PAGE),
            headers={**headers, "content-encoding": "gzip"},
        )
        assert gzipped.status_code == 200, gzipped.text
        np.testing.assert_allclose(
            gzipped.json()["data"][0]["embedding"], raw.json()["data"][0]["embedding"], atol=1e-6
        )
        extracted = client.post("/v1/extract", content=WINDOWS_1250_PAGE, headers=headers)
        assert extracted.status_code == 200, extracted.text
        assert extracted.json()["data"][0]["extractions"][0]["encoding"] in ("cp1250", "windows-1250")


def test_limits(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        declared = client.post(
            "/v1/embed", content=b"x" * (64 * 1024 + 1), headers={"content-type": "text/html"}
        )
        assert declared.status_code == 413
        assert declared.json()["error"]["code"] == "payload_too_large"

        def chunks() -> Iterator[bytes]:
            for _ in range(80):
                yield b"y" * 1024

        chunked = client.post("/v1/embed", content=chunks(), headers={"content-type": "text/html"})
        assert chunked.status_code == 413
        many = client.post("/v1/embed", json={"documents": [{"html": "<p>x</p>"}] * 17})
        assert many.status_code == 422 and many.json()["error"]["code"] == "too_many_documents"
        bad = client.post("/v1/embed", json={"documents": "nope"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error"


async def test_concurrent_singles_equal_one_batch(server: LiveServer) -> None:
    pages = [page(100 + i, paragraphs=1 + i % 5) for i in range(12)]
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        batch = await client.post("/v1/embed", json={"documents": [{"html": p} for p in pages]})
        assert batch.status_code == 200
        singles = await asyncio.gather(
            *(client.post("/v1/embed", json={"documents": [{"html": p}]}) for p in pages)
        )
    assert all(r.status_code == 200 for r in singles)
    for together, alone in zip(batch.json()["data"], (r.json()["data"][0] for r in singles), strict=True):
        assert alone["tokens"] == together["tokens"] and alone["truncated"] == together["truncated"]
        np.testing.assert_allclose(alone["embedding"], together["embedding"], atol=1e-6)
        assert alone["scores"].keys() == together["scores"].keys()
        np.testing.assert_allclose(alone["scores"]["quality"], together["scores"]["quality"], atol=1e-6)
        for label, p in together["scores"]["page_type"].items():
            assert alone["scores"]["page_type"][label] == pytest.approx(p, abs=1e-6)


def test_metrics_move(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        before = client.get("/metrics").text
        response = client.post("/v1/embed", json={"documents": [{"html": page(1)}, {"html": page(2)}]})
        assert response.status_code == 200
        tokens = response.json()["usage"]["tokens"]
        client.post("/v1/embed", json={"documents": [{"html": page(1)}], "heads": ["nope"]})
        after = client.get("/metrics").text
    route = {"route": "/v1/embed", "method": "POST"}
    assert metric(after, "htmllm_requests_total", status="200", **route) == (
        metric(before, "htmllm_requests_total", status="200", **route) + 1
    )
    for served_or_refused in ("2xx", "4xx"):  # the 200 and the 422 (an unknown head), timed apart
        duration = {"status_class": served_or_refused, **route}
        assert metric(after, "htmllm_request_duration_seconds_count", **duration) == (
            metric(before, "htmllm_request_duration_seconds_count", **duration) + 1
        )
    assert (
        metric(after, "htmllm_documents_processed_total")
        == metric(before, "htmllm_documents_processed_total") + 2
    )
    assert (
        metric(after, "htmllm_tokens_processed_total")
        == metric(before, "htmllm_tokens_processed_total") + tokens
    )
    assert metric(after, "htmllm_request_failures_total", code="unknown_head") == (
        metric(before, "htmllm_request_failures_total", code="unknown_head") + 1
    )
    assert metric(after, "htmllm_batch_size_count") > metric(before, "htmllm_batch_size_count")
    assert metric(after, "htmllm_batch_tokens_sum") >= metric(before, "htmllm_batch_tokens_sum") + tokens
    for stage in ("prune", "tokenize", "queue", "inference", "total"):
        assert metric(after, "htmllm_stage_duration_seconds_count", stage=stage) >= (
            metric(before, "htmllm_stage_duration_seconds_count", stage=stage) + 2
        ), stage
    assert metric(after, "htmllm_queue_size") == 0.0


def test_api_key(tiny_checkpoint: Path) -> None:
    with (
        live_server(tiny_settings(tiny_checkpoint, api_key="k3y")) as live,
        httpx.Client(base_url=live.url, timeout=60) as client,
    ):
        body = {"documents": [{"html": page(1)}]}
        assert client.post("/v1/embed", json=body).status_code == 401
        assert client.post("/v1/embed", json=body, headers={"authorization": "Basic k3y"}).status_code == 401
        ok = client.post("/v1/embed", json=body, headers={"authorization": "Bearer k3y"})
        assert ok.status_code == 200
        for route in ("/health", "/ready", "/metrics"):
            assert client.get(route).status_code == 200, route


async def test_flood_gets_429_with_retry_after(tiny_checkpoint: Path) -> None:
    settings = tiny_settings(tiny_checkpoint, max_queue_documents=8, max_wait_ms=50, retry_after_s=2)
    with live_server(settings) as live:
        body = {"documents": [{"html": page(i)} for i in range(4)]}
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            responses = await asyncio.gather(*(client.post("/v1/embed", json=body) for _ in range(40)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1 and statuses.count(200) >= 2, statuses
    for response in responses:
        if response.status_code == 429:
            assert response.headers["retry-after"] == "2"
            assert response.json()["error"]["code"] == "overloaded"


async def test_timeout_and_disconnect(tiny_checkpoint: Path) -> None:
    # A lone document waits max_wait_ms (2 s) for company, past the 0.3 s request timeout.
    settings = tiny_settings(tiny_checkpoint, request_timeout_s=0.3, max_wait_ms=2000)
    with live_server(settings) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as client:
            timed_out = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
            assert timed_out.status_code == 504
            assert timed_out.json()["error"]["code"] == "timeout"

            # A client that gives up first: the server notices before its own timeout (which would
            # count a second 504), cancels the documents and counts the request as closed by the client.
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/v1/embed", json={"documents": [{"html": page(2)}]}, timeout=0.1)
            route = {"route": "/v1/embed", "method": "POST"}
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                text = (await client.get("/metrics")).text
                closed = metric(text, "htmllm_requests_total", status="499", **route)
                timeouts = metric(text, "htmllm_requests_total", status="504", **route)
                if closed + timeouts >= 2:
                    break
                await asyncio.sleep(0.01)
            assert (closed, timeouts) == (1.0, 1.0)
            assert metric(text, "htmllm_queue_size") == 0.0


def test_a_bugs_500_closes_its_connection_cleanly(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """uvicorn closes the connection after a bug's 500 (Starlette re-raises it): the response says so,
    so a keep-alive client's next request goes on a new connection instead of into the reset."""
    from service.api.routers import embed as embed_router

    def broken(documents: object) -> object:
        raise RuntimeError("a bug")

    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/health").status_code == 200  # the connection the bug will close
        with monkeypatch.context() as patch:
            patch.setattr(embed_router, "to_documents", broken)
            failed = client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert failed.status_code == 500 and failed.headers["connection"] == "close"
        for _ in range(3):
            assert client.post("/v1/embed", json={"documents": [{"html": page(1)}]}).status_code == 200
        bad = client.post("/v1/embed", json={"documents": []})  # a typed error keeps the connection
        assert bad.status_code == 400 and "connection" not in bad.headers


def test_a_body_that_stalls_is_a_408_and_its_connection_closes(tiny_checkpoint: Path) -> None:
    """A client that declares 500 bytes and sends 10 held its connection for as long as it liked."""
    with live_server(tiny_settings(tiny_checkpoint, body_timeout_s=0.5)) as live:
        host, port = live.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            started = time.monotonic()
            sock.sendall(
                b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n"
                b"content-length: 500\r\n\r\n<p>stalled"
            )
            answer = b""
            while data := sock.recv(65536):  # until the server closes the connection
                answer += data
            waited = time.monotonic() - started
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert b"connection: close" in head.lower()
        assert json.loads(body)["error"]["code"] == "body_timeout"
        assert 0.4 < waited < 20
        assert httpx.post(live.url + "/v1/embed", json={"documents": [{"html": page(1)}]}).status_code == 200
        assert (
            metric(
                httpx.get(live.url + "/metrics").text, "htmllm_request_failures_total", code="body_timeout"
            )
            == 1
        )

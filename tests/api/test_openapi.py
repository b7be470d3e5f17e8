"""The OpenAPI document says what the server does: statuses, error bodies, headers, bodies and auth.

Clients are generated from /openapi.json, so an error the server sends that the document does not name,
a header it leaves out, or a body it reads differently from what the schema says, breaks them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from jsonschema import Draft202012Validator

from service.api.app import create_app
from service.api.errors import NOT_OVER_HTTP, STATUS
from service.api.settings import Settings
from service.core.errors import ErrorCode
from tests.api.conftest import SettingsFactory, app_client
from tests.api.pages import long_page, page

# One event loop for the module's async tests, so the shared `client` app lives across them.
on_module_loop = pytest.mark.asyncio(loop_scope="module")

EMBEDDING_OPERATIONS = {
    ("post", "/v1/embed"),
    ("post", "/v1/embeddings"),
    ("post", "/embeddings"),
    ("post", "/embed"),
    ("post", "/"),
    ("post", "/invocations"),
}
# TEI's tokenizer routes: keyed and limited as the model routes (/decode bounded by the request timeout too).
TOKENIZER_OPERATIONS = {("post", "/tokenize"), ("post", "/decode")}
MODEL_OPERATIONS = (
    EMBEDDING_OPERATIONS | TOKENIZER_OPERATIONS | {("post", "/v1/preprocess"), ("post", "/v1/extract")}
)
# OpenAI's model list: keyed as the model routes are, answering what a probe does.
MODEL_LISTS = {("get", "/v1/models"), ("get", "/models")}
# Its lookup: as the list, and 404 for a model this server does not run.
MODEL_LOOKUPS = {("get", "/v1/models/{model_id}"), ("get", "/models/{model_id}")}
PROBES = {("get", "/health"), ("get", "/"), ("get", "/ping")}
# What any request may be answered: its body's errors (every request passes the body limit) and a bug.
# Any request's body is read, decoded and charged to the in-flight budget (a GET may carry one).
# A GET's body is never read: the body's statuses (408, 413, 415, 422) are the model routes' alone.
EVERY_OPERATION = {"429", "500"}
MODEL_ROUTE = {"200", "400", "408", "413", "415", "422", "503", "504"} | EVERY_OPERATION

# Client generators name methods after these: renaming a Python function must not rename them.
OPERATION_IDS = {
    ("get", "/health"): "health_health_get",
    ("get", "/"): "health__get",
    ("get", "/ping"): "health_ping_get",
    ("get", "/ready"): "ready_ready_get",
    ("get", "/info"): "info_info_get",
    ("get", "/metrics"): "metrics_metrics_get",
    ("post", "/v1/embed"): "embed_v1_embed_post",
    ("post", "/v1/embeddings"): "embeddings_v1_embeddings_post",
    ("post", "/embeddings"): "embeddings_embeddings_post",
    ("post", "/embed"): "embed_embed_post",
    ("post", "/"): "embed__post",
    ("post", "/invocations"): "embed_invocations_post",
    ("post", "/v1/preprocess"): "preprocess_v1_preprocess_post",
    ("post", "/v1/extract"): "extract_text_v1_extract_post",
    ("post", "/tokenize"): "tokenize_tokenize_post",
    ("post", "/decode"): "decode_decode_post",
    ("get", "/v1/models"): "models_v1_models_get",
    ("get", "/models"): "models_models_get",
    ("get", "/v1/models/{model_id}"): "model_v1_models__model_id__get",
    ("get", "/models/{model_id}"): "model_models__model_id__get",
}


def document(settings: Settings) -> dict[str, Any]:
    """The app's document, built without starting it (no model is loaded for it)."""
    return create_app(settings).openapi()


def operations(doc: dict[str, Any]) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield (method, path), operation


def headers_of(doc: dict[str, Any], response: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A response's headers by lower-case name, references resolved."""
    resolved = {}
    for name, header in response.get("headers", {}).items():
        if "$ref" in header:
            header = doc["components"]["headers"][header["$ref"].rsplit("/", 1)[1]]
        resolved[name.lower()] = header
    return resolved


def required_headers(doc: dict[str, Any], key: tuple[str, str], status: int) -> set[str]:
    response = dict(operations(doc))[key]["responses"][str(status)]
    return {name for name, header in headers_of(doc, response).items() if header.get("required")}


@pytest.mark.parametrize("api_key", [None, "k1"])
def test_the_document_is_valid_openapi_3_1(settings_for: SettingsFactory, api_key: str | None) -> None:
    """The structure against the OpenAPI 3.1 schema (schemathesis' copy; openapi-spec-validator is not
    a dependency), and every schema in it against JSON Schema 2020-12, OpenAPI 3.1's dialect."""
    doc = document(settings_for(api_key=api_key))
    assert doc["openapi"].startswith("3.1")
    schemathesis.openapi.from_dict(doc).validate()

    def schemas(node: object) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "schema" and isinstance(value, dict):
                    yield value
                yield from schemas(value)
        elif isinstance(node, list):
            for value in node:
                yield from schemas(value)

    checked = [*schemas(doc["paths"]), *schemas(doc["components"]), *doc["components"]["schemas"].values()]
    for schema in checked:
        Draft202012Validator.check_schema(schema)
    assert len(checked) > 100


def test_operation_ids_are_unique_and_stable(settings_for: SettingsFactory) -> None:
    doc = document(settings_for())
    assert {key: operation["operationId"] for key, operation in operations(doc)} == OPERATION_IDS


def test_descriptions_name_no_private_code(settings_for: SettingsFactory) -> None:
    """A route's docstring is its public description: a private name (`_probe_refusal`) in one tells a
    client nothing it can use."""
    text = json.dumps(document(settings_for()))
    assert re.findall(r"`_\w+", text) == []


@pytest.mark.parametrize("api_key", [None, "k1"])
def test_each_operation_documents_exactly_the_statuses_it_can_answer(
    settings_for: SettingsFactory, api_key: str | None
) -> None:
    """Every status the server can send for an operation is documented, and none it cannot: /info
    never needs a key nor queues (it documented 401 and 504; its 429 is the body budget's), no
    operation documented a body timeout (408) or a fault (500), and 401 exists only where keys are
    configured; a code only the bulk commands write is named by none."""
    doc = document(settings_for(api_key=api_key))
    for key, operation in operations(doc):
        statuses = set(operation["responses"])
        # No key configured: a bearer token is accepted and ignored, so none is required.
        bearer: dict[str, list[str]] = {"HTTPBearer": []}
        if key in MODEL_OPERATIONS:
            assert statuses == MODEL_ROUTE | ({"401"} if api_key else set()), key
            assert operation["security"] == ([bearer] if api_key else [{}, bearer]), key
        elif key in MODEL_LISTS:
            assert statuses == {"200", "503"} | EVERY_OPERATION | ({"401"} if api_key else set()), key
            assert operation["security"] == ([bearer] if api_key else [{}, bearer]), key
        elif key in MODEL_LOOKUPS:
            assert statuses == {"200", "404", "503"} | EVERY_OPERATION | ({"401"} if api_key else set()), key
            assert operation["security"] == ([bearer] if api_key else [{}, bearer]), key
            assert [p["name"] for p in operation["parameters"]] == ["model_id"], key
        elif key == ("get", "/metrics"):
            assert statuses == {"200"} | EVERY_OPERATION
            assert "security" not in operation
        else:
            assert statuses == {"200", "503"} | EVERY_OPERATION, key
            assert "security" not in operation
        for status, response in operation["responses"].items():
            if status.startswith("2"):
                continue
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (key, status)
            named = [c for c in re.findall(r"`([a-z_]+)`", response["description"]) if c in set(ErrorCode)]
            assert named and all(STATUS[ErrorCode(c)] == int(status) for c in named), (key, status, named)
            # The bulk commands' own codes (`input_unreadable`) are never an HTTP answer's.
            assert not set(named) & {code.value for code in NOT_OVER_HTTP}, (key, status, named)
    codes = doc["components"]["schemas"]["ErrorCode"]["enum"]
    assert codes == [code.value for code in ErrorCode]  # the closed taxonomy


def test_the_headers_the_server_sends_are_documented(settings_for: SettingsFactory) -> None:
    doc = document(settings_for(api_key="k1"))
    for key, operation in operations(doc):
        for status, response in operation["responses"].items():
            headers = headers_of(doc, response)
            # Every answer names its request and says how long it took, errors included.
            assert headers["x-request-id"]["required"], (key, status)
            assert headers["x-total-time"]["required"], (key, status)
            # Retry-After comes with `overloaded`, `not_ready` and `shutting_down`, never with liveness'
            # `unhealthy`: a restart cures that, not a wait.
            retry = status == "429" or (status == "503" and key not in PROBES)
            assert ("retry-after" in headers) == retry, (key, status)
        if key in MODEL_OPERATIONS:
            assert "www-authenticate" in required_headers(doc, key, 401), key
        stages = {"x-prune-time", "x-tokenize-time", "x-queue-time", "x-inference-time"}
        own = {
            ("post", "/v1/preprocess"): {"x-preprocess-time"},
            ("post", "/v1/extract"): {"x-extract-time"},
            ("post", "/tokenize"): {"x-preprocess-time", "x-tokens-exact"},
        }
        sent = required_headers(doc, key, 200)
        documented = set(headers_of(doc, operation["responses"]["200"]))
        # A model route's answer names the checkpoint that made it (through a rollout, two do).
        model_routes = EMBEDDING_OPERATIONS | TOKENIZER_OPERATIONS | {("post", "/v1/preprocess")}
        model = {"x-checkpoint-sha256"} if key in model_routes else set()
        if key in EMBEDDING_OPERATIONS:
            # `on_error: report` with every document failed embeds nothing: only x-total-time is sent.
            always = stages if key != ("post", "/v1/embed") else set()
            assert sent == {"x-request-id", "x-total-time"} | always | model, key
            assert stages <= documented, key
        else:
            assert sent == documented == {"x-request-id", "x-total-time"} | own.get(key, set()) | model, key
        for status, response in operation["responses"].items():
            timed = {name for name in headers_of(doc, response) if name.endswith("-time")}
            if status != "200":  # stages are a success's: an error may come before any ran
                assert timed == {"x-total-time"}, (key, status)


def test_request_bodies_raw_pages_and_compression_are_documented(settings_for: SettingsFactory) -> None:
    doc = document(settings_for())
    raw = {("post", "/v1/embed"), ("post", "/v1/preprocess"), ("post", "/v1/extract")}
    for key, operation in operations(doc):
        if key[0] != "post":
            assert "requestBody" not in operation, key
            continue
        body = operation["requestBody"]
        wanted = (
            {"application/json", "text/html", "application/octet-stream"}
            if key in raw
            else {"application/json"}
        )
        assert set(body["content"]) == wanted, key
        assert "Content-Encoding" in body["description"] and "zstd" in body["description"], key
    schemas = doc["components"]["schemas"]
    # An empty list is refused (400), a repeated extractor too (422): the schema says so.
    for name, field in (
        ("EmbedRequest", "documents"),
        ("PreprocessRequest", "documents"),
        ("ExtractRequest", "documents"),
        ("OpenAIEmbeddingsRequest", "input"),
        ("TeiEmbedRequest", "inputs"),
    ):
        assert schemas[name]["properties"][field]["minItems"] == 1, name
    assert schemas["ExtractRequest"]["properties"]["extractors"]["uniqueItems"] is True
    parameters = doc["paths"]["/v1/extract"]["post"]["parameters"]
    (extractors,) = [p for p in parameters if p["name"] == "extractors"]
    assert extractors["schema"]["uniqueItems"] is True and extractors["schema"]["maxItems"] == 4


def test_base64_embeddings_are_described_as_base64(settings_for: SettingsFactory) -> None:
    schemas = document(settings_for())["components"]["schemas"]
    for name in ("EmbedResult", "OpenAIEmbedding"):
        (text,) = [s for s in schemas[name]["properties"]["embedding"]["anyOf"] if s.get("type") == "string"]
        assert text["contentEncoding"] == "base64", name
        assert "float32" in text["description"], name


@on_module_loop
async def test_a_405_allows_every_method_of_the_path(client: httpx.AsyncClient) -> None:
    """`/` is a probe (GET, HEAD) and TEI's embed (POST); Starlette's 405 named only the first route's."""
    for path, allowed in (("/", {"GET", "HEAD", "POST"}), ("/embed", {"POST"}), ("/health", {"GET", "HEAD"})):
        refused = await client.put(path)
        assert refused.status_code == 405, path
        assert set(refused.headers["allow"].split(", ")) == allowed, path


@on_module_loop
async def test_bodies_are_read_with_the_types_the_schema_gives(client: httpx.AsyncClient) -> None:
    """`0` is not a boolean, `"5"` not an integer (pydantic's lax mode read them as false and 5);
    an integer written `32.0` is one, as JSON Schema says."""
    html = page(1)
    dim = (await client.get("/info")).json()["embedding_dim"]
    for route, body in (
        ("/v1/embed", {"documents": [{"html": html}], "normalize": 0}),
        ("/v1/embed", {"documents": [{"html": html}], "truncate": "false"}),
        ("/embed", {"inputs": html, "truncate": 0.0}),
        ("/", {"inputs": html, "normalize": 1}),
        ("/v1/embeddings", {"input": html, "dimensions": str(dim)}),
        ("/v1/extract", {"documents": [{"html": html}], "min_words": "5"}),
        ("/v1/preprocess", {"documents": [{"html": html, "id": 7}]}),
        ("/tokenize", {"inputs": html, "add_special_tokens": 0}),
        ("/decode", {"ids": ["5"]}),
    ):
        refused = await client.post(route, json=body)
        assert refused.status_code == 422, (route, body, refused.text)
        assert refused.json()["error"]["code"] == "validation_error"
    for route, body in (
        ("/v1/embeddings", {"input": html, "dimensions": float(dim)}),
        ("/embed", {"inputs": html}),
    ):
        assert (await client.post(route, json=body)).status_code == 200, route


@on_module_loop
async def test_an_embedding_answer_without_embeddings_sends_only_the_total_time(
    client: httpx.AsyncClient,
) -> None:
    """Why the per-stage headers of /v1/embed are documented as optional."""
    failed = await client.post(
        "/v1/embed",
        params={"truncate": "false", "on_error": "report"},
        content=long_page().encode(),
        headers={"content-type": "text/html"},
    )
    assert failed.status_code == 200 and failed.json()["data"][0]["embedding"] is None
    assert "x-total-time" in failed.headers and "x-prune-time" not in failed.headers


@on_module_loop
async def test_a_missing_key_is_a_documented_401(settings_for: SettingsFactory) -> None:
    settings = settings_for(api_key="k1")
    doc = document(settings)
    async with app_client(settings) as keyed:
        for key in sorted(MODEL_OPERATIONS):
            refused = await keyed.post(key[1], json={})
            assert refused.status_code == 401, key
            documented = required_headers(doc, key, 401)
            assert {"www-authenticate", "x-request-id"} <= documented <= set(refused.headers), key
        assert (await keyed.get("/info")).status_code == 200


def test_the_extractors_default_is_in_the_schema_as_the_route_uses_it() -> None:
    """A default_factory is not written into the schema: the document had shown no default."""
    from service.api.schemas import ExtractRequest

    schema = ExtractRequest.model_json_schema()["properties"]["extractors"]
    assert schema["default"] == ExtractRequest.model_validate({"documents": [{"html": "x"}]}).extractors

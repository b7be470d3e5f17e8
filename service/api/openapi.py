"""The OpenAPI document: what every operation answers, and the request bodies FastAPI cannot infer.

Clients are generated from this document, so it says what the server does. Routes read their bodies
themselves (JSON or one raw page; JSON with or without a Content-Type), so FastAPI does not see a body
parameter: `raw_body_openapi` and `json_body_openapi` declare the content types. Each router names the
errors of its own operations (`error_responses`); `install_openapi` adds what the middleware and the
error handler do on every operation: the body's errors (408, 413, 415, 422, 429) and a bug's 500, the
`x-request-id` and `x-total-time` headers on every response, and the API key's 401 where the server has
keys.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from service.api import schemas
from service.api.checkpoint_identity import CHECKPOINT_HEADER
from service.api.errors import NOT_OVER_HTTP, RETRYABLE, STATUS
from service.api.schemas import ErrorBody
from service.core.errors import ErrorCode

_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}

_DESCRIPTIONS: dict[int, str] = {
    400: "empty input: no documents, or an empty raw body",
    401: "a missing or wrong API key",
    404: "no such resource: a model this server does not run",
    408: "the body did not arrive within `HTMLLM_BODY_TIMEOUT_S`, or no byte of it came for 10 s (or the "
    "request line and headers within `HTMLLM_HEAD_TIMEOUT_S`, on any route); the connection is closed",
    413: "the body, or what a compressed body decodes to, is over `HTMLLM_MAX_BODY_BYTES`; or a JSON "
    "request's body and parsed text alone need more than `HTMLLM_MAX_INFLIGHT_BYTES`",
    415: "a Content-Type or Content-Encoding the service does not take",
    422: "an invalid request",
    429: "the queue is full, or the request bodies the server holds would pass `HTMLLM_MAX_INFLIGHT_BYTES`: "
    "retry after `Retry-After` seconds",
    500: "a server fault",
    503: "the service cannot take the request now",
    504: "the request timeout (`HTMLLM_REQUEST_TIMEOUT_S`) passed",
}

# Headers by name in `components.headers`; responses refer to them.
HEADERS: dict[str, dict[str, Any]] = {
    "x-request-id": {
        "description": "the request's id: the client's own `x-request-id` if usable, else a new uuid4 (hex)",
        "required": True,
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:@/+=-]{1,128}$"},
    },
    "Retry-After": {
        "description": "seconds to wait before retrying (`HTMLLM_RETRY_AFTER_S`)",
        "required": True,
        "schema": {"type": "integer", "minimum": 0},
    },
    "WWW-Authenticate": {
        "description": "the scheme to authenticate with",
        "required": True,
        "schema": {"type": "string", "const": "Bearer"},
    },
    "x-total-time": {
        "description": "milliseconds from the request's arrival to its answer (body read, queueing and "
        "response compression included); on every answer, errors included",
        "required": True,
        "schema": {"type": "number", "minimum": 0},
    },
}
# The stage headers each kind of route sends on its 200, with what they measure (milliseconds).
EMBEDDING_STAGES = {
    "x-prune-time": "pruning: the slowest of the request's documents",
    "x-tokenize-time": "tokenizing: the slowest of the request's documents",
    "x-queue-time": "waiting for a forward pass: the slowest of the request's documents",
    "x-inference-time": "the forward pass: the slowest of the request's documents",
}
PREPROCESS_STAGES = {
    "x-preprocess-time": "pruning and tokenizing, waiting for a preprocessing worker included: the slowest "
    "of the request's documents",
}
# `POST /tokenize`'s answer (`service.api.routers.tei`): whether every list holds all of its page's tokens.
TOKENS_EXACT_HEADER = "x-tokens-exact"
TOKENS_EXACT_RESPONSE: dict[str, Any] = {
    "description": "`false` when a page's list stopped at 16 times the model's max length, as "
    "/v1/preprocess stops counting (`tokens_exact`): that page has more tokens than its list; else `true`",
    "required": True,
    "schema": {"type": "string", "enum": ["true", "false"]},
}
EXTRACT_STAGES = {
    "x-extract-time": "extracting text, waiting for an extractor thread included: until the request's last "
    "extraction ended, or the request timeout passed",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/headers/{name}"}


def error_response(status: int, codes: Iterable[ErrorCode] | None = None) -> dict[str, Any]:
    """The response object of one error status: an `ErrorBody`, its description naming the codes it
    carries (by default every code `STATUS` maps to it that HTTP answers carry) and the headers sent
    with them."""
    if codes is None:
        codes = [code for code in STATUS if STATUS[code] == status and code not in NOT_OVER_HTTP]
    carried = list(codes)
    if not carried or any(STATUS[code] != status for code in carried):
        raise ValueError(f"codes {carried} are not the codes of status {status}")
    names = ", ".join(f"`{code.value}`" for code in carried)
    response: dict[str, Any] = {
        "description": f"{_DESCRIPTIONS[status]} ({names})",
        "content": copy.deepcopy(_ERROR_BODY),
    }
    headers = {}
    retryable = [code in RETRYABLE for code in carried]
    if any(retryable):
        sometimes = {**HEADERS["Retry-After"], "required": False}
        headers["Retry-After"] = _ref("Retry-After") if all(retryable) else sometimes
    if ErrorCode.UNAUTHORIZED in carried:
        headers["WWW-Authenticate"] = _ref("WWW-Authenticate")
    if headers:
        response["headers"] = headers
    return response


def error_responses(
    *statuses: int, codes: Mapping[int, Sequence[ErrorCode]] | None = None
) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses` for these error statuses; `codes` narrows a status to the codes it carries."""
    codes = codes or {}
    return {status: error_response(status, codes.get(status)) for status in statuses}


# What the model routes answer besides 200: 422 and 500 with every code of theirs (`install_openapi` adds
# 408, 413 and 415, and 401 where keys are configured).
UNAVAILABLE = {503: (ErrorCode.NOT_READY, ErrorCode.SHUTTING_DOWN)}
# A 400 of the app is `empty_input`; the parser's `malformed_request`, from below the app, is in the API's
# description (as the 431 and 408 `head_timeout` are).
MODEL_ROUTE_ERRORS = error_responses(
    400, 422, 429, 500, 503, 504, codes={400: (ErrorCode.EMPTY,), **UNAVAILABLE}
)


def timing_responses(
    stages: Mapping[str, str], *, every_stage: bool = True, checkpoint: bool = True
) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses` entry: the stage headers of a route's 200 (`EMBEDDING_STAGES`, ...), in
    milliseconds, and, on a model route's (`checkpoint`), `CHECKPOINT_HEADER`; `x-total-time` and
    `x-request-id`, on every answer, are `install_openapi`'s.

    `every_stage=False` where a 200 may have run no stage (`on_error: report` with every document
    failed embeds nothing): the stage headers are then absent.
    """
    headers = {
        name: {
            "description": f"milliseconds of {stage}"
            + ("" if every_stage else " (absent when no document was embedded)"),
            "required": every_stage,
            "schema": {"type": "number", "minimum": 0},
        }
        for name, stage in stages.items()
    }
    if checkpoint:
        headers[CHECKPOINT_HEADER] = {
            "description": "the fingerprint of the checkpoint that answered (`checkpoint_sha256` of /info, "
            "what `htmllm embed` records): through a rollout, which model made these results",
            "required": True,
            "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        }
    return {200: {"headers": headers}}


_COMPRESSION = (
    " The body may be compressed: `Content-Encoding` `gzip` (or `x-gzip`), `deflate`, `br` or `zstd`, or "
    "a list of them in the order applied; an unknown coding is 415, a corrupt stream 422, and a body "
    "that decodes to more than `HTMLLM_MAX_BODY_BYTES` 413; a compressed body (gzip, zlib, zstd) that "
    "no `Content-Encoding` declares is 415."
)


def raw_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose body is `model` as JSON or one raw page."""
    return {
        "requestBody": {
            "required": True,
            "description": "JSON (`application/json`, any `+json` type, or no Content-Type), or one raw "
            "page: `text/html` (its `charset` parameter is the page's declared encoding; likewise "
            "`application/xhtml+xml`, `text/xml` and `application/xml`, as a crawler forwards them) or "
            "`application/octet-stream` (the encoding is detected; a `charset` parameter, which that type "
            "does not define, is ignored), with the options in the query "
            "string (sent with a JSON body they are a 422); an empty page, or an empty body without a "
            "Content-Type, is 400 `empty_input` whatever options it has (an unknown or invalid one is "
            "422 first)." + _COMPRESSION,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}},
                "text/html": {"schema": {"type": "string", "minLength": 1, "description": "the page"}},
                "application/octet-stream": {
                    "schema": {"type": "string", "format": "binary", "minLength": 1}
                },
            },
        }
    }


def json_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its JSON body `model` itself."""
    return {
        "requestBody": {
            "required": True,
            "description": "JSON (`application/json`, any `+json` type, or no Content-Type)." + _COMPRESSION,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


# Every operation can answer these: a connection past the pipeline cap gets 429 from below the app
# (`http_protocol`), and the error handler answers a bug with 500.
_EVERY_OPERATION = error_responses(429, 500, codes={429: [ErrorCode.OVERLOADED], 500: [ErrorCode.INTERNAL]})
# And an operation that reads a body (one with a requestBody: the model routes' POSTs, which alone the
# body limit middleware reads, decodes and charges to the in-flight budget) these: a GET's body is never
# read, so a spec that listed them on /info or /health gave generated clients errors that cannot happen.
_BODY_OPERATION = error_responses(
    408,
    413,
    415,
    422,
    429,
    500,
    codes={422: [ErrorCode.VALIDATION], 429: [ErrorCode.OVERLOADED], 500: [ErrorCode.INTERNAL]},
)


def _complete(schema: dict[str, Any], *, auth: bool) -> None:
    """Add to every operation what the middleware and the error handler do on all of them."""
    for path_item in schema["paths"].values():
        for operation in path_item.values():
            responses = operation["responses"]
            every = _BODY_OPERATION if "requestBody" in operation else _EVERY_OPERATION
            for status, response in every.items():
                responses.setdefault(str(status), copy.deepcopy(response))
            if "security" in operation:  # the routes that depend on `require_api_key`
                if auth:
                    responses.setdefault("401", error_response(401))
                else:
                    # No key configured: a bearer token is accepted and ignored, none is needed.
                    operation["security"] = [{}, *operation["security"]]
            for response in responses.values():
                headers = response.setdefault("headers", {})
                headers["x-request-id"] = _ref("x-request-id")
                headers["x-total-time"] = _ref("x-total-time")
            operation["responses"] = dict(sorted(responses.items()))


def _body_models(schema: dict[str, Any]) -> list[type[BaseModel]]:
    """The request body models the operations refer to (`raw_body_openapi`, `json_body_openapi`), from
    `service.api.schemas`, where every body is defined: a route's body is in the components however the
    app was put together (a body missing there had left its `$ref` pointing at nothing)."""
    names = {
        media["schema"]["$ref"].rsplit("/", 1)[1]
        for path_item in schema["paths"].values()
        for operation in path_item.values()
        for media in operation.get("requestBody", {}).get("content", {}).values()
        if "$ref" in media.get("schema", {})
    }
    models = []
    for name in sorted(names):
        model = getattr(schemas, name, None)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise RuntimeError(
                f"a request body refers to {name!r}, which service.api.schemas does not define"
            )
        models.append(model)
    return models


def install_openapi(
    app: FastAPI, *, description: str, body_models: Sequence[type[BaseModel]] = (), auth: bool
) -> None:
    """Build the document once, on first request, with the raw-body routes' models in the components:
    those the operations refer to, and `body_models`.

    `auth`: whether the model routes need an API key (then they document 401; else the key is optional).
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=description, routes=app.routes)
        components = schema.setdefault("components", {})
        models = components.setdefault("schemas", {})
        all_models: dict[type[BaseModel], None] = dict.fromkeys(
            (*body_models, *_body_models(schema), ErrorBody)
        )
        for model in all_models:
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            models.update(model_schema.pop("$defs", {}))
            models[model.__name__] = model_schema
        components["headers"] = copy.deepcopy(HEADERS)
        _complete(schema, auth=auth)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
